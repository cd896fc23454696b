"""Decoding of OTLP/HTTP trace requests (protobuf or JSON, gzip or deflate) into
checked spans. Anything the database could not store, or would store as garbage
(times out of range, numbers that are not numbers, NUL characters, attribute
values nested without bound), is refused here with the span and field named, so
a request is stored whole or not at all."""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from tracing.ingest.mapping import map_attributes

__all__ = [
    "ATTRIBUTE_MAX_DEPTH",
    "TOKENS_MAX",
    "IngestError",
    "LimitExceeded",
    "OtlpSpan",
    "decode_body",
    "parse_request",
    "time_of",
]

# Attribute values (arrays, key-value lists) nest at most this deep; real
# instrumentations stay far below, and every later walk over them (redaction,
# JSON encoding, the UI) stays bounded.
ATTRIBUTE_MAX_DEPTH = 16
# A span's token count is at most this; with OTLP_INGEST_MAX_SPANS spans per
# request a run's totals stay far inside a 64-bit column.
TOKENS_MAX = 10**12
_TOKEN_KEYS = ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
_INT64 = 2**63
_UINT64 = 2**64  # OTLP times are fixed64 nanoseconds since the epoch


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
    # Already mapped onto the gen_ai.* names (see tracing.ingest.mapping).
    attributes: dict[str, Any]
    events: list[dict[str, Any]]
    service: str


def time_of(ns: int) -> dt.datetime:
    """An OTLP time (nanoseconds since the epoch) as an aware datetime."""
    # Whole microseconds from integers: a float of 10^18 ns loses them.
    seconds, rest = divmod(ns, 1_000_000_000)
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC) + dt.timedelta(
        microseconds=rest // 1000
    )


_KINDS = {0: "internal", 1: "internal", 2: "server", 3: "client", 4: "producer",
          5: "consumer"}  # fmt: skip
_STATUS = {0: "unset", 1: "ok", 2: "error"}
_JSON_STATUS = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


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


# -- checked values ---------------------------------------------------------


def _text(value: Any, what: str) -> str:
    """A string the database stores as sent: PostgreSQL refuses NUL, and a lone
    surrogate (JSON "\\ud800") is not UTF-8 on either engine."""
    if not isinstance(value, str):
        raise IngestError(f"{what} must be a string")
    if "\x00" in value:
        raise IngestError(f"{what} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise IngestError(f"{what} is not valid Unicode (a lone surrogate)") from None
    return value


def _double(value: Any) -> float | str:
    """A finite float; NaN and the infinities (valid OTLP doubles) are kept as
    their names, which JSON columns can store."""
    if not math.isfinite(value):
        return (
            "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        )
    return float(value)


# Long enough for any out-of-range number to be read and named as such, short
# enough for int() (which refuses strings of more than 4300 digits).
_DECIMAL = re.compile(r"^-?[0-9]{1,64}$")


def _json_int(value: Any, what: str) -> int:
    """An int64 in proto JSON: a number or a string of decimal digits."""
    if isinstance(value, str) and _DECIMAL.match(value):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise IngestError(f"{what} must be an integer, not {_shown(value)}")
    if not -_INT64 <= value < _INT64:
        raise IngestError(f"{what} is out of the 64-bit integer range")
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _json_any(value: Any, what: str, depth: int) -> Any:
    """An OTLP AnyValue in proto JSON, checked, as a Python value."""
    if depth > ATTRIBUTE_MAX_DEPTH:
        raise IngestError(f"{what} nests deeper than {ATTRIBUTE_MAX_DEPTH} levels")
    if not isinstance(value, dict):
        raise IngestError(f"{what} must be an AnyValue object")
    if "stringValue" in value:
        return _text(value["stringValue"], what)
    if "boolValue" in value:
        if not isinstance(value["boolValue"], bool):
            raise IngestError(f"{what}: boolValue must be true or false")
        return value["boolValue"]
    if "intValue" in value:
        return _json_int(value["intValue"], f"{what}: intValue")
    if "doubleValue" in value:
        raw = value["doubleValue"]
        if isinstance(raw, str):
            try:  # proto JSON spells NaN and the infinities as strings
                raw = float(raw) if raw.strip() == raw else None
            except ValueError:
                raw = None
        if not isinstance(raw, (int, float)) or isinstance(raw, bool):
            raise IngestError(f"{what}: doubleValue must be a number")
        try:
            return _double(float(raw))
        except OverflowError:
            raise IngestError(f"{what}: doubleValue is out of range") from None
    if "arrayValue" in value:
        items = _field(value["arrayValue"], "values", list, f"{what}: arrayValue")
        return [_json_any(v, f"{what}[{i}]", depth + 1) for i, v in enumerate(items)]
    if "kvlistValue" in value:
        items = _field(value["kvlistValue"], "values", list, f"{what}: kvlistValue")
        return _json_kvs(items, what, depth + 1)
    if "bytesValue" in value:
        raw = _text(value["bytesValue"], f"{what}: bytesValue")
        try:
            base64.b64decode(raw, validate=True)
        except ValueError:
            raise IngestError(f"{what}: bytesValue must be base64") from None
        return raw
    return None


def _field(obj: Any, key: str, kind: type, what: str) -> Any:
    if not isinstance(obj, dict):
        raise IngestError(f"{what} must be an object")
    value = obj.get(key)
    if value is None:
        value = kind()
    if not isinstance(value, kind):
        raise IngestError(f"{what}: {key} must be a {kind.__name__}")
    return value


def _json_kvs(items: Any, what: str, depth: int = 1) -> dict[str, Any]:
    if not isinstance(items, list):
        raise IngestError(f"{what}: attributes must be a list")
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, dict) or "key" not in item:
            raise IngestError(f"{what}: an attribute has no key")
        key = _text(item["key"], f"{what}: an attribute key")
        out[key] = _json_any(item.get("value") or {}, f"{what}.{key}", depth)
    return out


def _proto_any(value: Any, what: str, depth: int) -> Any:
    if depth > ATTRIBUTE_MAX_DEPTH:
        raise IngestError(f"{what} nests deeper than {ATTRIBUTE_MAX_DEPTH} levels")
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "string_value":
        return _text(value.string_value, what)
    if which == "double_value":
        return _double(value.double_value)
    if which == "array_value":
        return [
            _proto_any(v, f"{what}[{i}]", depth + 1)
            for i, v in enumerate(value.array_value.values)
        ]
    if which == "kvlist_value":
        return _proto_kvs(value.kvlist_value.values, what, depth + 1)
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, which)  # bool_value, int_value


def _proto_kvs(items: Iterable[Any], what: str, depth: int = 1) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key = _text(item.key, f"{what}: an attribute key")
        out[key] = _proto_any(item.value, f"{what}.{key}", depth)
    return out


def _time_ns(value: Any, what: str) -> int:
    """Nanoseconds since the epoch, a fixed64: 0 (unset) up to 2^64-1 (year 2554)."""
    if isinstance(value, str) and _DECIMAL.match(value):
        value = int(value)
    if value is None or value == "":
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise IngestError(f"{what} must be an integer of nanoseconds")
    if not 0 <= value < _UINT64:
        raise IngestError(
            f"{what} is out of range (nanoseconds since 1970, 0 to 2^64-1)"
        )
    return value


_HEX = re.compile(r"^[0-9a-f]*$")


def _hex_id(raw: Any, size: int, what: str, *, optional: bool = False) -> str:
    if isinstance(raw, bytes):
        text = raw.hex()
    else:
        if raw is not None and not isinstance(raw, str):
            raise IngestError(f"{what} must be a string of hex digits")
        text = (raw or "").lower()
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


def _checked(span: OtlpSpan) -> OtlpSpan:
    """What holds for every span, whichever the encoding."""
    where = f"span {span.span_id}"
    if not span.start_ns:
        raise IngestError(f"{where} has no start time")
    if span.parent_span_id == span.span_id:
        raise IngestError(f"{where} is its own parent")
    span.attributes = map_attributes(span.attributes)
    for key in _TOKEN_KEYS:
        if key in span.attributes:
            span.attributes[key] = _tokens(span.attributes[key], f"{where}: {key}")
    return span


def _tokens(value: Any, what: str) -> int:
    """A token count: a whole number (sent as int, float or digits) in range."""
    if isinstance(value, str) and _DECIMAL.match(value):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise IngestError(f"{what} must be a whole number, not {_shown(value)}")
    if not 0 <= value <= TOKENS_MAX:
        raise IngestError(f"{what} must be between 0 and {TOKENS_MAX}")
    return value


# -- the two encodings ------------------------------------------------------


def _from_proto(body: bytes) -> list[OtlpSpan]:
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise IngestError(f"the body is not an OTLP protobuf request: {exc}") from exc
    spans: list[OtlpSpan] = []
    for resource_spans in request.resource_spans:
        resource = _proto_kvs(resource_spans.resource.attributes, "resource")
        service = _service(resource)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                span_id = _hex_id(span.span_id, 8, "spanId")
                where = f"span {span_id}"
                spans.append(
                    _checked(
                        OtlpSpan(
                            trace_id=_hex_id(span.trace_id, 16, "traceId"),
                            span_id=span_id,
                            parent_span_id=_hex_id(
                                span.parent_span_id, 8, "parentSpanId", optional=True
                            ),
                            name=_text(span.name, f"{where}: name"),
                            kind=_KINDS.get(span.kind, "internal"),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            status=_STATUS.get(span.status.code, "unset"),
                            status_message=_text(
                                span.status.message, f"{where}: status message"
                            ),
                            attributes=_proto_kvs(span.attributes, where),
                            events=[
                                {
                                    "name": _text(event.name, f"{where}: event name"),
                                    "time_unix_nano": event.time_unix_nano,
                                    "attributes": _proto_kvs(
                                        event.attributes, f"{where}: event {event.name}"
                                    ),
                                }
                                for event in span.events
                            ],
                            service=service,
                        )
                    )
                )
    return spans


def _service(resource: dict[str, Any]) -> str:
    name = resource.get("service.name")
    return name if isinstance(name, str) and name else "external"


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON (proto JSON spells it as a string)")


def _json_resources(body: bytes, key: str) -> list[Any]:
    """The `key` list (resourceSpans, resourceLogs) of an OTLP/JSON body."""
    try:
        document = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise IngestError("the JSON body nests too deep to read") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise IngestError(f"the body is not JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get(key, []), list):
        raise IngestError(f"expected an object with a {key} list")
    resources: list[Any] = document.get(key, [])
    return resources


def _from_json(body: bytes) -> list[OtlpSpan]:
    spans: list[OtlpSpan] = []
    for resource_spans in _json_resources(body, "resourceSpans"):
        resource_attributes = _field(
            _field(resource_spans, "resource", dict, "resourceSpans[]"),
            "attributes",
            list,
            "resource",
        )
        service = _service(_json_kvs(resource_attributes, "resource"))
        for scope_spans in _field(resource_spans, "scopeSpans", list, "resource"):
            for span in _field(scope_spans, "spans", list, "scopeSpans[]"):
                spans.append(_checked(_json_span(span, service)))
    return spans


def _json_span(span: Any, service: str) -> OtlpSpan:
    if not isinstance(span, dict):
        raise IngestError("a span must be an object")
    span_id = _hex_id(span.get("spanId"), 8, "spanId")
    where = f"span {span_id}"
    status = span.get("status") or {}
    if not isinstance(status, dict):
        raise IngestError(f"{where}: status must be an object")
    code = status.get("code", 0)
    if isinstance(code, str):
        code = _JSON_STATUS.get(code, 0)
    kind = span.get("kind", 1)
    events = span.get("events", [])
    if not isinstance(events, list):
        raise IngestError(f"{where}: events must be a list")
    return OtlpSpan(
        trace_id=_hex_id(span.get("traceId"), 16, "traceId"),
        span_id=span_id,
        parent_span_id=_hex_id(
            span.get("parentSpanId"), 8, "parentSpanId", optional=True
        ),
        name=_text(span.get("name") or "", f"{where}: name"),
        kind=_KINDS.get(kind, "internal") if isinstance(kind, int) else "internal",
        start_ns=_time_ns(span.get("startTimeUnixNano"), f"{where}: startTimeUnixNano"),
        end_ns=_time_ns(span.get("endTimeUnixNano"), f"{where}: endTimeUnixNano"),
        status=_STATUS.get(code, "unset") if isinstance(code, int) else "unset",
        status_message=_text(status.get("message") or "", f"{where}: status message"),
        attributes=_json_kvs(span.get("attributes", []), where),
        events=[_json_event(event, where) for event in events],
        service=service,
    )


def _json_event(event: Any, where: str) -> dict[str, Any]:
    if not isinstance(event, dict):
        raise IngestError(f"{where}: an event must be an object")
    name = _text(event.get("name") or "", f"{where}: event name")
    return {
        "name": name,
        "time_unix_nano": _time_ns(
            event.get("timeUnixNano"), f"{where}: event {name} timeUnixNano"
        ),
        "attributes": _json_kvs(event.get("attributes", []), f"{where}: event {name}"),
    }


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
    return spans
