"""OTLP/HTTP trace ingest: decode (protobuf or JSON, gzip), map the GenAI,
OpenInference and Traceloop attribute names onto ours, store as external runs."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import zlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max

from controlplane.models import Tenant
from runs.models import Run
from runs.services.external import run_external_for_trace, run_external_update
from tracing.models import RunEvent, Span, SpanPayload
from tracing.redaction import redact, redact_attributes
from tracing.services import run_event_broadcast
from tracing.store import (
    PAYLOAD_KEYS,
    payload_encode,
    span_event_payload,
    telemetry_transaction,
)

__all__ = [
    "IngestError",
    "IngestResult",
    "LimitExceeded",
    "decode_body",
    "ingest_spans",
    "map_attributes",
    "parse_request",
]


class IngestError(ValueError):
    """The request is malformed; nothing was stored (400)."""


class LimitExceeded(IngestError):
    """A configured limit was passed; nothing was stored (413)."""


@dataclass
class OtlpSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    start_ns: int
    end_ns: int
    status: str
    status_message: str
    attributes: dict[str, Any]
    events: list[dict[str, Any]]
    service: str


@dataclass
class IngestResult:
    spans: int
    runs: list[str]


# -- decoding ---------------------------------------------------------------

_KINDS = {0: "internal", 1: "internal", 2: "server", 3: "client", 4: "producer",
          5: "consumer"}  # fmt: skip
_STATUS = {0: "unset", 1: "ok", 2: "error"}
_JSON_STATUS = {"STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


def decode_body(body: bytes, *, encoding: str) -> bytes:
    """Undo Content-Encoding (gzip, deflate or none) within the size limit."""
    limit = settings.OTLP_INGEST_MAX_BYTES
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise IngestError(f"unsupported Content-Encoding {encoding!r}")
    inflater = zlib.decompressobj(31 if encoding == "gzip" else 15)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise IngestError(f"the body is not valid {encoding}: {exc}") from exc
    if len(data) > limit or inflater.unconsumed_tail:
        raise LimitExceeded(
            f"the decompressed body exceeds OTLP_INGEST_MAX_BYTES={limit} bytes"
        )
    return data


def _any_value(value: Any) -> Any:
    """An OTLP AnyValue (protobuf message or JSON dict) as a Python value."""
    if isinstance(value, dict):
        for key in ("stringValue", "boolValue", "doubleValue"):
            if key in value:
                return value[key]
        if "intValue" in value:
            return int(value["intValue"])
        if "arrayValue" in value:
            return [_any_value(v) for v in value["arrayValue"].get("values", [])]
        if "kvlistValue" in value:
            return _kvs(value["kvlistValue"].get("values", []))
        if "bytesValue" in value:
            return value["bytesValue"]
        return None
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _kvs(value.kvlist_value.values)
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, which)


def _kvs(items: Iterable[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if isinstance(item, dict):
            if "key" not in item:
                raise IngestError("an attribute has no key")
            out[str(item["key"])] = _any_value(item.get("value") or {})
        else:
            out[item.key] = _any_value(item.value)
    return out


_HEX = re.compile(r"^[0-9a-f]*$")


def _hex_id(raw: Any, size: int, what: str, *, optional: bool = False) -> str:
    if isinstance(raw, bytes):
        text = raw.hex()
    else:
        text = str(raw or "").lower()
        if text and not _HEX.match(text):
            # Some JSON encoders send ids base64-encoded, as protobuf JSON does.
            try:
                text = base64.b64decode(text, validate=True).hex()
            except (ValueError, TypeError) as exc:
                raise IngestError(f"{what} is neither hex nor base64") from exc
    if not text and optional:
        return ""
    if len(text) != size * 2 or not _HEX.match(text) or int(text, 16) == 0:
        raise IngestError(f"{what} must be {size} bytes and not all zero")
    return text


def _from_proto(body: bytes) -> list[OtlpSpan]:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    try:
        request = ExportTraceServiceRequest.FromString(body)
    except (DecodeError, ValueError) as exc:
        raise IngestError(f"the body is not an OTLP protobuf request: {exc}") from exc
    spans: list[OtlpSpan] = []
    for resource_spans in request.resource_spans:
        resource = _kvs(resource_spans.resource.attributes)
        service = str(resource.get("service.name") or "external")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    OtlpSpan(
                        trace_id=_hex_id(span.trace_id, 16, "traceId"),
                        span_id=_hex_id(span.span_id, 8, "spanId"),
                        parent_span_id=_hex_id(
                            span.parent_span_id, 8, "parentSpanId", optional=True
                        ),
                        name=span.name,
                        kind=_KINDS.get(span.kind, "internal"),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        status=_STATUS.get(span.status.code, "unset"),
                        status_message=span.status.message,
                        attributes=_kvs(span.attributes),
                        events=[
                            {
                                "name": event.name,
                                "time_unix_nano": event.time_unix_nano,
                                "attributes": _kvs(event.attributes),
                            }
                            for event in span.events
                        ],
                        service=service,
                    )
                )
    return spans


def _int(value: Any, what: str) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError) as exc:
        raise IngestError(f"{what} must be an integer") from exc


def _from_json(body: bytes) -> list[OtlpSpan]:
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise IngestError(f"the body is not JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(
        document.get("resourceSpans", []), list
    ):
        raise IngestError("expected an object with a resourceSpans list")
    spans: list[OtlpSpan] = []
    try:
        for resource_spans in document.get("resourceSpans", []):
            resource = _kvs(
                (resource_spans.get("resource") or {}).get("attributes", [])
            )
            service = str(resource.get("service.name") or "external")
            for scope_spans in resource_spans.get("scopeSpans", []):
                for span in scope_spans.get("spans", []):
                    status = span.get("status") or {}
                    code = status.get("code", 0)
                    if isinstance(code, str):
                        code = {"STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}.get(
                            code, 0
                        )
                    kind = span.get("kind", 1)
                    spans.append(
                        OtlpSpan(
                            trace_id=_hex_id(span.get("traceId"), 16, "traceId"),
                            span_id=_hex_id(span.get("spanId"), 8, "spanId"),
                            parent_span_id=_hex_id(
                                span.get("parentSpanId"),
                                8,
                                "parentSpanId",
                                optional=True,
                            ),  # fmt: skip
                            name=str(span.get("name") or ""),
                            kind=_KINDS.get(
                                kind if isinstance(kind, int) else 1, "internal"
                            ),  # fmt: skip
                            start_ns=_int(span.get("startTimeUnixNano"), "start"),
                            end_ns=_int(span.get("endTimeUnixNano"), "end"),
                            status=_STATUS.get(code, "unset"),
                            status_message=str(status.get("message") or ""),
                            attributes=_kvs(span.get("attributes", [])),
                            events=[
                                {
                                    "name": str(event.get("name") or ""),
                                    "time_unix_nano": _int(
                                        event.get("timeUnixNano"), "event time"
                                    ),
                                    "attributes": _kvs(event.get("attributes", [])),
                                }
                                for event in span.get("events", [])
                            ],
                            service=service,
                        )
                    )
    except (AttributeError, TypeError) as exc:
        raise IngestError(f"the OTLP JSON has an unexpected shape: {exc}") from exc
    return spans


def parse_request(body: bytes, *, content_type: str) -> list[OtlpSpan]:
    """Decode an ExportTraceServiceRequest; raise IngestError if malformed."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == "application/x-protobuf":
        spans = _from_proto(body)
    elif kind == "application/json":
        spans = _from_json(body)
    else:
        raise IngestError(
            "Content-Type must be application/x-protobuf or application/json"
        )
    limit = settings.OTLP_INGEST_MAX_SPANS
    if len(spans) > limit:
        raise LimitExceeded(
            f"{len(spans)} spans in one request; OTLP_INGEST_MAX_SPANS={limit}"
        )
    for span in spans:
        if not span.start_ns:
            raise IngestError(f"span {span.span_id} has no start time")
    return spans


# -- attribute mapping ------------------------------------------------------

_OPENINFERENCE_OPERATIONS = {
    "LLM": "chat", "TOOL": "execute_tool", "AGENT": "invoke_agent",
    "EMBEDDING": "embeddings", "RETRIEVER": "retrieval",
}  # fmt: skip
_TRACELOOP_OPERATIONS = {"agent": "invoke_agent", "tool": "execute_tool",
                         "workflow": "invoke_agent"}  # fmt: skip
_SIMPLE_RENAMES = {
    # OpenInference
    "llm.model_name": "gen_ai.request.model",
    "llm.provider": "gen_ai.provider.name",
    "llm.system": "gen_ai.provider.name",
    "llm.token_count.prompt": "gen_ai.usage.input_tokens",
    "llm.token_count.completion": "gen_ai.usage.output_tokens",
    "tool.name": "gen_ai.tool.name",
    "tool_call.id": "gen_ai.tool.call.id",
    "agent.name": "gen_ai.agent.name",
    "session.id": "gen_ai.conversation.id",
    # Traceloop / OpenLLMetry and older GenAI names
    "gen_ai.system": "gen_ai.provider.name",
    "gen_ai.usage.prompt_tokens": "gen_ai.usage.input_tokens",
    "gen_ai.usage.completion_tokens": "gen_ai.usage.output_tokens",
    "llm.usage.prompt_tokens": "gen_ai.usage.input_tokens",
    "llm.usage.completion_tokens": "gen_ai.usage.output_tokens",
    "llm.request.model": "gen_ai.request.model",
    "llm.response.model": "gen_ai.response.model",
}
_INDEXED = re.compile(r"^gen_ai\.(prompt|completion)\.(\d+)\.(\w+)$")


def map_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """One vocabulary: OpenInference and Traceloop names become gen_ai.* ones.

    Names already in gen_ai.* win; the source names that carried payloads are
    folded into the payload keys, the rest are kept as they came.
    """
    out: dict[str, Any] = {}
    indexed: dict[str, dict[int, dict[str, Any]]] = {"prompt": {}, "completion": {}}
    for key, value in attributes.items():
        match = _INDEXED.match(key)
        if match:
            kind, index, field = match.group(1), int(match.group(2)), match.group(3)
            indexed[kind].setdefault(index, {})[field] = value
            continue
        out[key] = value
    for source, target in _SIMPLE_RENAMES.items():
        if source in attributes and target not in attributes:
            out.setdefault(target, attributes[source])
    operation = out.get("gen_ai.operation.name")
    oi_kind = str(attributes.get("openinference.span.kind") or "").upper()
    tl_kind = str(attributes.get("traceloop.span.kind") or "").lower()
    if not operation:
        operation = _OPENINFERENCE_OPERATIONS.get(oi_kind) or _TRACELOOP_OPERATIONS.get(
            tl_kind
        )
        if not operation and attributes.get("llm.request.type") == "chat":
            operation = "chat"
        if operation:
            out["gen_ai.operation.name"] = operation
    entity = attributes.get("traceloop.entity.name")
    if entity:
        if operation == "execute_tool":
            out.setdefault("gen_ai.tool.name", entity)
        elif operation == "invoke_agent":
            out.setdefault("gen_ai.agent.name", entity)
    # Inputs and outputs, whatever they were called.
    tool = operation == "execute_tool"
    source_input = attributes.get(
        "input.value", attributes.get("traceloop.entity.input")
    )
    source_output = attributes.get(
        "output.value", attributes.get("traceloop.entity.output")
    )
    input_key = "gen_ai.tool.call.arguments" if tool else "gen_ai.input.messages"
    output_key = "gen_ai.tool.call.result" if tool else "gen_ai.output.messages"
    if source_input is not None:
        out.setdefault(input_key, source_input)
    if source_output is not None:
        out.setdefault(output_key, source_output)
    if indexed["prompt"]:
        out.setdefault(
            "gen_ai.input.messages",
            [indexed["prompt"][i] for i in sorted(indexed["prompt"])],
        )
    if indexed["completion"]:
        completions = [indexed["completion"][i] for i in sorted(indexed["completion"])]
        out.setdefault("gen_ai.output.messages", completions)
        reasons = [c["finish_reason"] for c in completions if "finish_reason" in c]
        if reasons:
            out.setdefault("gen_ai.response.finish_reasons", reasons)
    for source in ("input.value", "output.value", "traceloop.entity.input",
                   "traceloop.entity.output"):  # fmt: skip
        out.pop(source, None)
    return out


# -- storing ----------------------------------------------------------------


def _time(ns: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC)


def _payload_rows(
    tenant: Tenant,
    attributes: dict[str, Any],
    rows: dict[str, SpanPayload],
    encodings: dict[str, tuple[str, str, int]],
) -> tuple[dict[str, Any], dict[str, str]]:
    plain: dict[str, Any] = {}
    refs: dict[str, str] = {}
    for key, value in attributes.items():
        if key not in PAYLOAD_KEYS:
            plain[key] = value
            continue
        cache_key = value if isinstance(value, str) else None
        encoded = encodings.get(cache_key) if cache_key is not None else None
        if encoded is None:
            encoded = payload_encode(value)
            if cache_key is not None:
                encodings[cache_key] = encoded
        digest, text, size = encoded
        rows.setdefault(
            digest,
            SpanPayload(tenant=tenant, sha256=digest, size=size, content=text),
        )
        refs[key] = digest
    return plain, refs


def _message_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value[:20_000]
    return json.dumps(value, ensure_ascii=False, default=str)[:20_000]


def _store_trace(
    tenant: Tenant, trace_id: str, spans: list[OtlpSpan]
) -> tuple[Run, RunEvent | None]:
    first = min(spans, key=lambda s: s.start_ns)
    run = run_external_for_trace(
        tenant=tenant,
        trace_id=trace_id,
        service=first.service,
        started_at=_time(first.start_ns),
    )
    payloads: dict[str, SpanPayload] = {}
    encodings: dict[str, tuple[str, str, int]] = {}  # the same prompt, once
    rows: list[Span] = []
    input_tokens = output_tokens = 0
    failed = False
    root_input = root_output = None
    for span in spans:
        attributes = redact_attributes(map_attributes(span.attributes))
        plain, refs = _payload_rows(tenant, attributes, payloads, encodings)
        if plain.get("gen_ai.operation.name") == "chat":
            input_tokens += _safe_int(plain.get("gen_ai.usage.input_tokens"))
            output_tokens += _safe_int(plain.get("gen_ai.usage.output_tokens"))
        if not span.parent_span_id:
            failed = failed or span.status == "error"
            root_input = attributes.get("gen_ai.input.messages", root_input)
            root_output = attributes.get("gen_ai.output.messages", root_output)
        rows.append(
            Span(
                run=run,
                trace_id=trace_id,
                span_id=span.span_id,
                parent_span_id=span.parent_span_id,
                name=span.name[:300],
                kind=span.kind,
                status=span.status if span.end_ns else Span.Status.RUNNING,
                status_message=redact(span.status_message),
                started_at=_time(span.start_ns),
                ended_at=_time(span.end_ns) if span.end_ns else None,
                attributes=plain,
                events=redact(
                    [
                        {
                            "name": e["name"],
                            "time": _time(e["time_unix_nano"]).isoformat()
                            if e["time_unix_nano"]
                            else None,
                            "attributes": e["attributes"],
                        }
                        for e in span.events
                    ]
                ),
                payloads=refs,
            )
        )
    SpanPayload.objects.bulk_create(list(payloads.values()), ignore_conflicts=True)
    # A span sent again (exporter retry) replaces its earlier row.
    Span.objects.filter(
        trace_id=trace_id, span_id__in=[r.span_id for r in rows]
    ).delete()
    Span.objects.bulk_create(rows)
    stored = list(
        Span.objects.filter(trace_id=trace_id, span_id__in=[r.span_id for r in rows])
    )
    last = _append_events(run, stored)
    run_external_update(
        run=run,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        failed=failed,
        input=_message_text(root_input),
        final_answer=_message_text(root_output),
        finished_at=max((_time(s.end_ns) for s in spans if s.end_ns), default=None),
    )
    return run, last


def _safe_int(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def _append_events(run: Run, spans: list[Span]) -> RunEvent | None:
    """One `span.ended` event per span, consecutive seqs, one insert."""
    if not spans:
        return None
    for _ in range(20):
        last = RunEvent.objects.filter(run=run).aggregate(m=Max("seq"))["m"] or 0
        events = [
            RunEvent(
                run=run,
                seq=last + offset,
                type="span.ended",
                payload=span_event_payload(span),
            )
            for offset, span in enumerate(spans, start=1)
        ]
        try:
            with transaction.atomic():
                RunEvent.objects.bulk_create(events)
        except IntegrityError:
            continue
        return RunEvent.objects.get(run=run, seq=last + len(spans))
    raise IntegrityError(f"run {run.id}: could not take {len(spans)} seqs")


def ingest_spans(*, tenant: Tenant, spans: list[OtlpSpan]) -> IngestResult:
    """Store decoded spans, one external run per trace id, all or nothing."""
    by_trace: dict[str, dict[str, OtlpSpan]] = defaultdict(dict)
    for span in spans:
        by_trace[span.trace_id][span.span_id] = span  # a repeated span: the last

    runs: list[str] = []
    with telemetry_transaction():
        for trace_id, members in by_trace.items():
            run, last = _store_trace(tenant, trace_id, list(members.values()))
            runs.append(str(run.id))
            if last is not None:
                # One broadcast per trace: a stream that sees the jump in seq
                # fills the rest from the log.
                event = last
                transaction.on_commit(
                    lambda event=event: run_event_broadcast(  # type: ignore[misc]
                        event=event, tenant_id=tenant.id
                    )
                )
    return IngestResult(spans=len(spans), runs=runs)
