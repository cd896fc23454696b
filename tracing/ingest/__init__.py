"""OTLP/HTTP trace ingest, the tracing half: decode (protobuf or JSON, gzip) and
check (`otlp`), map the GenAI, OpenInference and Traceloop attribute names onto
ours and summarise a trace (`mapping`), store spans in a run named by id
(`storing`). Which run a trace is belongs to the runs app
(`runs.services.external.ingest_spans`). Log records: `logs` decodes them and
finds the GenAI events' model messages, `log_storing` keeps those and puts them
on their spans (`runs.services.external_logs.ingest_logs`)."""

from __future__ import annotations

from tracing.ingest.log_storing import (
    log_messages_expire,
    log_messages_store,
    span_log_messages_apply,
)
from tracing.ingest.logs import (
    LogMessage,
    OtlpLogRecord,
    log_messages_of,
    parse_logs_request,
)
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
    "LogMessage",
    "OtlpLogRecord",
    "OtlpSpan",
    "SpanUsage",
    "TraceSummary",
    "decode_body",
    "log_messages_expire",
    "log_messages_of",
    "log_messages_store",
    "map_attributes",
    "parse_logs_request",
    "parse_request",
    "span_log_messages_apply",
    "time_of",
    "trace_store",
    "usage_of",
]
