"""OTLP/HTTP trace ingest, the tracing half: decode (protobuf or JSON, gzip) and
check (`otlp`), map the GenAI, OpenInference and Traceloop attribute names onto
ours and summarise a trace (`mapping`), store spans in a run named by id
(`storing`). Which run a trace is belongs to the runs app
(`runs.services.external.ingest_spans`)."""

from __future__ import annotations

from tracing.ingest.mapping import SpanUsage, TraceSummary, map_attributes, usage_of
from tracing.ingest.otlp import (
    IngestError,
    LimitExceeded,
    OtlpSpan,
    decode_body,
    parse_request,
    time_of,
)
from tracing.ingest.storing import trace_store

__all__ = [
    "IngestError",
    "LimitExceeded",
    "OtlpSpan",
    "SpanUsage",
    "TraceSummary",
    "decode_body",
    "map_attributes",
    "parse_request",
    "time_of",
    "trace_store",
    "usage_of",
]
