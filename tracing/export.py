"""Stored spans as an OTLP ExportTraceServiceRequest in its JSON encoding, the
inverse of `tracing.ingest`: what `POST /v1/traces` reads back is the same tree.

OTLP JSON (opentelemetry-proto, "JSON Protobuf Encoding"): trace and span ids
are hex strings, 64-bit integers (times, intValue) are decimal strings, enums
(kind, status code) are integers, attributes are KeyValue lists of typed
AnyValue. A span's payloads (model input/output, tool arguments/results) go back
into the attributes they were split from.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from tracing.ingest.otlp import ATTRIBUTE_MAX_DEPTH
from tracing.models import Span

__all__ = ["any_value", "otlp_trace_request"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_KINDS = {"internal": 1, "server": 2, "client": 3, "producer": 4, "consumer": 5}
_STATUS = {"ok": 1, "error": 2}  # running, unset, abandoned: unset
_INT64 = 2**63


def _nanos(value: dt.datetime | None) -> str:
    if value is None:
        return "0"
    return str((value - _EPOCH) // dt.timedelta(microseconds=1) * 1000)


def _iso_nanos(value: Any) -> str:
    if not isinstance(value, str) or not value:
        return "0"
    try:
        return _nanos(dt.datetime.fromisoformat(value))
    except ValueError:
        return "0"


def any_value(value: Any, depth: int = 1) -> dict[str, Any]:
    """A Python value as an OTLP AnyValue (JSON encoding); None is the empty one.

    A structure nested deeper than OTLP ingest reads (`ATTRIBUTE_MAX_DEPTH`)
    is sent from there on as its JSON text, so the export is always readable.
    """
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        if -_INT64 <= value < _INT64:
            return {"intValue": str(value)}
        return {"stringValue": str(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"doubleValue": value}
        return {"stringValue": str(value)}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, (Mapping, list, tuple)) and depth >= ATTRIBUTE_MAX_DEPTH:
        return {"stringValue": json.dumps(value, ensure_ascii=False, default=str)}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": _key_values(value, depth + 1)}}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [any_value(v, depth + 1) for v in value]}}
    return {"stringValue": str(value)}


def _key_values(values: Mapping[str, Any], depth: int = 1) -> list[dict[str, Any]]:
    return [
        {"key": str(key), "value": any_value(value, depth)}
        for key, value in values.items()
    ]


def _span(span: Span, attributes: Mapping[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "traceId": span.trace_id,
        "spanId": span.span_id,
        "name": span.name,
        "kind": _KINDS.get(span.kind, 1),
        "startTimeUnixNano": _nanos(span.started_at),
        "endTimeUnixNano": _nanos(span.ended_at),
        "attributes": _key_values(attributes),
        "events": [
            {
                "timeUnixNano": _iso_nanos(event.get("time")),
                "name": str(event.get("name") or ""),
                "attributes": _key_values(event.get("attributes") or {}),
            }
            for event in span.events
            if isinstance(event, dict)
        ],
        "status": {"code": _STATUS.get(span.status, 0)},
    }
    if span.parent_span_id:
        body["parentSpanId"] = span.parent_span_id
    if span.status_message:
        body["status"]["message"] = span.status_message
    return body


def otlp_trace_request(
    *,
    spans: Iterable[tuple[Span, Mapping[str, Any]]],
    service_name: str,
    resource: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One resource and one scope holding `spans`, each given with the
    attributes to export (already redacted, payloads folded back in)."""
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": _key_values(
                        {"service.name": service_name, **(resource or {})}
                    )
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "agent-control-plane.export"},
                        "spans": [_span(span, attrs) for span, attrs in spans],
                    }
                ],
            }
        ]
    }
