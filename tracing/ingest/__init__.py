"""OTLP/HTTP trace ingest: decode (protobuf or JSON, gzip) and check
(`otlp`), map the GenAI, OpenInference and Traceloop attribute names onto ours
(`mapping`), store as the tenant's external runs (`storing`)."""

from __future__ import annotations

from tracing.ingest.mapping import map_attributes
from tracing.ingest.otlp import (
    IngestError,
    LimitExceeded,
    OtlpSpan,
    decode_body,
    parse_request,
)
from tracing.ingest.storing import IngestResult, ingest_spans

__all__ = [
    "IngestError",
    "IngestResult",
    "LimitExceeded",
    "OtlpSpan",
    "decode_body",
    "ingest_spans",
    "map_attributes",
    "parse_request",
]
