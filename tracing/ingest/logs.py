"""OTLP log records in (`POST /v1/logs`, gRPC LogsService): decoding and checks
like the spans' (`tracing.ingest.otlp`), and the GenAI events among them turned
into the model messages of the span they name.

The official GenAI instrumentations (opentelemetry-instrumentation-openai-v2
and the others built on opentelemetry-util-genai) send message content as log
records ("events") by default, not on the span: one record per input message
(`gen_ai.system.message`, `gen_ai.user.message`, `gen_ai.assistant.message`,
`gen_ai.tool.message`) and per choice (`gen_ai.choice`), or, in the newer
conventions, one `gen_ai.client.inference.operation.details` record whose
attributes hold `gen_ai.input.messages`, `gen_ai.output.messages` and
`gen_ai.system_instructions` whole. Each carries the trace and span id of the
model call; `LogMessage`s say which payload of which span they belong to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
)

# The checked-value readers of the span decoder: one set of rules for both.
from tracing.ingest.otlp import (
    IngestError,
    LimitExceeded,
    _field,
    _hex_id,
    _json_any,
    _json_kvs,
    _json_resources,
    _proto_any,
    _proto_kvs,
    _service,
    _text,
    _time_ns,
)

__all__ = [
    "INPUT",
    "OUTPUT",
    "SYSTEM",
    "LogMessage",
    "OtlpLogRecord",
    "log_messages_of",
    "parse_logs_request",
]

INPUT = "gen_ai.input.messages"
OUTPUT = "gen_ai.output.messages"
SYSTEM = "gen_ai.system_instructions"
DETAILS_EVENT = "gen_ai.client.inference.operation.details"
# Event name -> the role of the input message it carries.
_MESSAGE_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
CHOICE_EVENT = "gen_ai.choice"


@dataclass
class OtlpLogRecord:
    index: int  # its place in the request: the order it was emitted in
    trace_id: str  # "" when the record names no trace
    span_id: str
    event_name: str
    time_ns: int  # time_unix_nano, else observed_time_unix_nano
    body: Any
    attributes: dict[str, Any]
    service: str


@dataclass
class LogMessage:
    """Part of one span's model input or output, from one log record.

    `whole`: `content` is the payload entire (a details event); otherwise it is
    one message, and the span's payload lists such messages in emission order."""

    record: int  # OtlpLogRecord.index
    trace_id: str
    span_id: str
    key: str  # INPUT, OUTPUT or SYSTEM: the span payload it belongs to
    time_ns: int
    content: Any
    whole: bool = False


# -- decoding ---------------------------------------------------------------


def _event_name(name: str, attributes: dict[str, Any]) -> str:
    # SDKs before the LogRecord.event_name field put it in an attribute.
    legacy = attributes.get("event.name")
    return name or (legacy if isinstance(legacy, str) else "")


def _from_proto(body: bytes) -> list[OtlpLogRecord]:
    try:
        request = ExportLogsServiceRequest.FromString(body)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise IngestError(f"the body is not an OTLP protobuf request: {exc}") from exc
    records: list[OtlpLogRecord] = []
    for resource_logs in request.resource_logs:
        service = _service(_proto_kvs(resource_logs.resource.attributes, "resource"))
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                where = f"log record {len(records)}"
                attributes = _proto_kvs(record.attributes, where)
                body_value = (
                    _proto_any(record.body, f"{where}: body", 1)
                    if record.HasField("body")
                    else None
                )
                records.append(
                    OtlpLogRecord(
                        index=len(records),
                        trace_id=_hex_id(
                            record.trace_id, 16, f"{where}: traceId", optional=True
                        ),
                        span_id=_hex_id(
                            record.span_id, 8, f"{where}: spanId", optional=True
                        ),
                        event_name=_event_name(
                            _text(record.event_name, f"{where}: eventName"),
                            attributes,
                        ),
                        time_ns=record.time_unix_nano or record.observed_time_unix_nano,
                        body=body_value,
                        attributes=attributes,
                        service=service,
                    )
                )
    return records


def _from_json(body: bytes) -> list[OtlpLogRecord]:
    records: list[OtlpLogRecord] = []
    for resource_logs in _json_resources(body, "resourceLogs"):
        resource = _field(
            _field(resource_logs, "resource", dict, "resourceLogs[]"),
            "attributes",
            list,
            "resource",
        )
        service = _service(_json_kvs(resource, "resource"))
        for scope_logs in _field(resource_logs, "scopeLogs", list, "resource"):
            for record in _field(scope_logs, "logRecords", list, "scopeLogs[]"):
                records.append(_json_record(record, len(records), service))
    return records


def _json_record(record: Any, index: int, service: str) -> OtlpLogRecord:
    where = f"log record {index}"
    if not isinstance(record, dict):
        raise IngestError(f"{where} must be an object")
    attributes = _json_kvs(record.get("attributes", []), where)
    body = record.get("body")
    time_ns = _time_ns(record.get("timeUnixNano"), f"{where}: timeUnixNano")
    observed = _time_ns(
        record.get("observedTimeUnixNano"), f"{where}: observedTimeUnixNano"
    )
    return OtlpLogRecord(
        index=index,
        trace_id=_hex_id(record.get("traceId"), 16, f"{where}: traceId", optional=True),
        span_id=_hex_id(record.get("spanId"), 8, f"{where}: spanId", optional=True),
        event_name=_event_name(
            _text(record.get("eventName") or "", f"{where}: eventName"), attributes
        ),
        time_ns=time_ns or observed,
        body=None if body is None else _json_any(body, f"{where}: body", 1),
        attributes=attributes,
        service=service,
    )


def parse_logs_request(body: bytes, *, content_type: str) -> list[OtlpLogRecord]:
    """Decode an ExportLogsServiceRequest; IngestError if malformed, LimitExceeded
    past OTLP_INGEST_MAX_LOG_RECORDS."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == "application/x-protobuf":
        records = _from_proto(body)
    elif kind == "application/json":
        records = _from_json(body)
    else:
        raise IngestError(
            "Content-Type must be application/x-protobuf or application/json"
        )
    limit = settings.OTLP_INGEST_MAX_LOG_RECORDS
    if len(records) > limit:
        raise LimitExceeded(
            f"{len(records)} log records in one request; "
            f"OTLP_INGEST_MAX_LOG_RECORDS={limit}"
        )
    return records


# -- GenAI events -> span messages ----------------------------------------------


def _message(role: str, body: Any) -> dict[str, Any]:
    """An input message in the chat shape the control plane's own spans use
    (`{"role", "content", "tool_calls"?, "tool_call_id"?}`), from an event body."""
    if not isinstance(body, dict):
        return {"role": role} if body is None else {"role": role, "content": body}
    message = {"role": role, **body}
    if role == "tool" and "id" in message and "tool_call_id" not in message:
        message["tool_call_id"] = message.pop("id")
    return message


def _choice(body: Any) -> dict[str, Any]:
    """An output message from a `gen_ai.choice` body
    (`{"index", "finish_reason", "message": {"role", "content", "tool_calls"}}`)."""
    if not isinstance(body, dict):
        return {"role": "assistant", "content": body}
    inner = body.get("message")
    message = dict(inner) if isinstance(inner, dict) else {}
    message["role"] = message.get("role") or "assistant"
    for key in ("finish_reason", "index"):
        if key in body:
            message[key] = body[key]
    return message


def _whole(value: Any) -> Any:
    """A details event's attribute: structured, or the JSON text of it."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def log_messages_of(
    records: list[OtlpLogRecord],
) -> tuple[list[LogMessage], list[OtlpLogRecord]]:
    """The span messages the records carry, and the records that carry none
    (no trace and span id, or not a GenAI event this maps)."""
    messages: list[LogMessage] = []
    skipped: list[OtlpLogRecord] = []
    for record in records:
        found = _record_messages(record) if record.trace_id and record.span_id else []
        if found:
            messages.extend(found)
        else:
            skipped.append(record)
    return messages, skipped


def _record_messages(record: OtlpLogRecord) -> list[LogMessage]:
    def part(key: str, content: Any, *, whole: bool = False) -> LogMessage:
        return LogMessage(
            record=record.index,
            trace_id=record.trace_id,
            span_id=record.span_id,
            key=key,
            time_ns=record.time_ns,
            content=content,
            whole=whole,
        )

    name = record.event_name
    if name in _MESSAGE_EVENTS:
        return [part(INPUT, _message(_MESSAGE_EVENTS[name], record.body))]
    if name == CHOICE_EVENT:
        return [part(OUTPUT, _choice(record.body))]
    if name == DETAILS_EVENT:
        return [
            part(key, _whole(record.attributes[key]), whole=True)
            for key in (SYSTEM, INPUT, OUTPUT)
            if record.attributes.get(key) is not None
        ]
    return []
