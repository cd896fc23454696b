"""POST /v1/traces with values the database cannot hold (or would hold as
garbage): a 400 naming the span and field, and nothing stored, in either
encoding. The bad span comes last, after good ones, so a partial write shows."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as Span_pb

from controlplane.services import api_token_issue
from runs.models import Run
from tests.tracing.test_ingest import otlp_json, post
from tracing.ingest.otlp import ATTRIBUTE_MAX_DEPTH
from tracing.models import RunEvent, Span, SpanPayload
from tracing.selectors import span_payloads


@pytest.fixture
def secret(admin_user: Any, tenant: Any) -> str:
    return api_token_issue(tenant=tenant, user=admin_user).secret


def nothing_stored() -> bool:
    return not (
        Span.objects.exists()
        or Run.objects.exists()
        or RunEvent.objects.exists()
        or SpanPayload.objects.exists()
    )


NESTED = "<nested>"


def nested_json(depth: int) -> dict[str, Any]:
    """A placeholder for an AnyValue nesting `depth` key-value lists (spliced in
    as text: the json module will not write it)."""
    return {"stringValue": f"{NESTED}{depth}"}


def with_last_span(change: Callable[[dict[str, Any]], None]) -> bytes:
    body = otlp_json(3)
    change(body["resourceSpans"][0]["scopeSpans"][0]["spans"][-1])
    text = json.dumps(body)
    if NESTED in text:
        start = text.index('{"stringValue": "' + NESTED)
        end = text.index("}", start) + 1
        depth = int(text[start:end].split(NESTED)[1].split('"')[0])
        level = '{"kvlistValue": {"values": [{"key": "k", "value": '
        nested = level * depth + '{"stringValue": "leaf"}' + "}]}}" * depth
        text = text[:start] + nested + text[end:]
    return text.encode()


def unchanged_json(span: dict[str, Any]) -> None:
    pass


def attribute(key: str, value: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda span: span["attributes"].append({"key": key, "value": value})


JSON_CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "start 1e30": (
        lambda s: s.update(startTimeUnixNano=10**30),
        "startTimeUnixNano is out of range",
    ),
    "start -1e30": (
        lambda s: s.update(startTimeUnixNano=str(-(10**30))),
        "startTimeUnixNano is out of range",
    ),
    "end 1e30": (
        lambda s: s.update(endTimeUnixNano=str(10**30)),
        "endTimeUnixNano is out of range",
    ),
    "event time -1e30": (
        lambda s: s.update(
            events=[{"name": "e", "timeUnixNano": -(10**30), "attributes": []}]
        ),
        "event e timeUnixNano is out of range",
    ),
    "start not a number": (
        lambda s: s.update(startTimeUnixNano="soon"),
        "startTimeUnixNano must be an integer",
    ),
    "intValue abc": (
        attribute("retries", {"intValue": "abc"}),
        "span 0000000000000003.retries: intValue must be an integer",
    ),
    "intValue 1e40": (
        attribute("big", {"intValue": str(10**40)}),
        "big: intValue is out of the 64-bit integer range",
    ),
    "input tokens 1e40 as an int": (
        attribute("gen_ai.usage.input_tokens", {"intValue": str(10**40)}),
        "gen_ai.usage.input_tokens: intValue is out of the 64-bit",
    ),
    "input tokens 1e40 as a double": (
        attribute("gen_ai.usage.output_tokens", {"doubleValue": 1e40}),
        "gen_ai.usage.output_tokens must be between 0 and",
    ),
    "OpenInference tokens 1e40": (
        attribute("llm.token_count.completion", {"doubleValue": 1e40}),
        "gen_ai.usage.output_tokens must be between 0 and",
    ),
    "tokens that are not a number": (
        attribute("gen_ai.usage.input_tokens", {"stringValue": "many"}),
        "gen_ai.usage.input_tokens must be a whole number",
    ),
    "doubleValue text": (
        attribute("score", {"doubleValue": "high"}),
        "score: doubleValue must be a number",
    ),
    "boolValue text": (
        attribute("ok", {"boolValue": "yes"}),
        "ok: boolValue must be true or false",
    ),
    "attribute nested 900 deep": (
        attribute("deep", nested_json(900)),
        "nests too deep",
    ),
    "attribute nested past the limit": (
        attribute("deep", nested_json(ATTRIBUTE_MAX_DEPTH + 1)),
        f"deeper than {ATTRIBUTE_MAX_DEPTH} levels",
    ),
    "NUL in a name": (lambda s: s.update(name="a\x00b"), "name contains a NUL"),
    "NUL in a value": (
        attribute("note", {"stringValue": "x\x00"}),
        "note contains a NUL",
    ),
    "NUL in a key": (
        attribute("k\x00", {"stringValue": "x"}),
        "attribute key contains a NUL",
    ),
    "NUL in a status message": (
        lambda s: s.update(status={"code": 2, "message": "\x00"}),
        "status message contains a NUL",
    ),
    "NUL in an event name": (
        lambda s: s.update(events=[{"name": "\x00", "timeUnixNano": "1"}]),
        "event name contains a NUL",
    ),
    "a lone surrogate": (
        attribute("note", {"stringValue": "\ud800"}),
        "not valid Unicode",
    ),
    "its own parent": (
        lambda s: s.update(parentSpanId=s["spanId"]),
        "is its own parent",
    ),
}


@pytest.mark.parametrize("case", list(JSON_CASES))
def test_bad_values_in_otlp_json_are_400_naming_them_and_nothing_is_stored(
    secret: str, case: str
) -> None:
    change, says = JSON_CASES[case]
    response = post(Client(), with_last_span(change), secret=secret)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert says in error["message"], error["message"]
    assert nothing_stored()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nests too deep"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [' * 5000,
            "nests too deep",
        ),
        (b'{"resourceSpans": NaN}', "not JSON"),
        (
            json.dumps(
                {
                    "resourceSpans": [
                        {
                            "resource": {
                                "attributes": [
                                    {
                                        "key": "service.name",
                                        "value": {"stringValue": "bot\x00"},
                                    }
                                ]
                            },
                            "scopeSpans": [],
                        }
                    ]
                }
            ).encode(),
            "resource.service.name contains a NUL",
        ),  # fmt: skip
    ],
    ids=["nested arrays", "nested objects", "NaN", "NUL in the service name"],
)
def test_bodies_that_cannot_be_read_are_400_and_nothing_is_stored(
    secret: str, body: bytes, says: str
) -> None:
    response = post(Client(), body, secret=secret)
    assert response.status_code == 400, response.content
    assert says in response.json()["error"]["message"]
    assert nothing_stored()


def proto_request(change: Callable[[Any], None], raw_attribute: bytes = b"") -> bytes:
    """Three spans, the last one changed; `raw_attribute` (an encoded KeyValue)
    is appended to it as bytes: the protobuf library itself refuses to build a
    message nested past 100 levels, a sender need not."""
    spans = []
    for index in range(3):
        span = Span_pb()
        span.trace_id = bytes.fromhex("5b8efff798038103d269b633813fc60c")
        span.span_id = (index + 1).to_bytes(8, "big")
        span.parent_span_id = b"" if index == 0 else (1).to_bytes(8, "big")
        span.name = f"span {index}"
        span.start_time_unix_nano = 1_700_000_000_000_000_000
        span.end_time_unix_nano = 1_700_000_001_000_000_000
        spans.append(span)
    change(spans[-1])
    encoded = [span.SerializeToString() for span in spans]
    if raw_attribute:
        encoded[-1] += field(9, raw_attribute)  # Span.attributes
    scope = b"".join(field(2, span) for span in encoded)  # ScopeSpans.spans
    resource = field(2, scope)  # ResourceSpans.scope_spans
    request = field(1, resource)  # ExportTraceServiceRequest.resource_spans
    return request


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def proto_nested(depth: int) -> bytes:
    """An encoded KeyValue "deep" whose value nests `depth` key-value lists."""
    value = AnyValue(string_value="leaf").SerializeToString()
    for _ in range(depth):
        pair = field(1, b"k") + field(2, value)  # KeyValue.key, .value
        value = field(6, field(1, pair))  # AnyValue.kvlist_value.values
    return field(1, b"deep") + field(2, value)


def proto_attribute(key: str, value: AnyValue) -> Callable[[Any], None]:
    return lambda span: span.attributes.append(KeyValue(key=key, value=value))


def unchanged(span: Any) -> None:
    pass


PROTO_CASES: dict[str, tuple[Callable[[Any], None], str]] = {
    "input tokens 1e15": (
        proto_attribute("gen_ai.usage.input_tokens", AnyValue(int_value=10**15)),
        "gen_ai.usage.input_tokens must be between 0 and",
    ),
    "output tokens 1e40": (
        proto_attribute("gen_ai.usage.output_tokens", AnyValue(double_value=1e40)),
        "gen_ai.usage.output_tokens must be between 0 and",
    ),
    "NUL in a name": (
        lambda span: setattr(span, "name", "a\x00b"),
        "name contains a NUL",
    ),
    "NUL in a value": (
        proto_attribute("note", AnyValue(string_value="x\x00")),
        "note contains a NUL",
    ),
    "NUL in a status message": (
        lambda span: setattr(span.status, "message", "\x00"),
        "status message contains a NUL",
    ),
}


@pytest.mark.parametrize("case", list(PROTO_CASES))
def test_bad_values_in_otlp_protobuf_are_400_naming_them_and_nothing_is_stored(
    secret: str, case: str
) -> None:
    change, says = PROTO_CASES[case]
    response = post(
        Client(), proto_request(change), secret=secret,
        content_type="application/x-protobuf",
    )  # fmt: skip
    assert response.status_code == 400, response.content
    assert says in response.json()["error"]["message"]
    assert nothing_stored()


@pytest.mark.parametrize(
    ("depth", "says"),
    [
        (ATTRIBUTE_MAX_DEPTH + 1, f"deeper than {ATTRIBUTE_MAX_DEPTH} levels"),
        (900, "not an OTLP protobuf request"),
    ],
)
def test_attributes_nested_too_deep_in_protobuf_are_400_and_nothing_is_stored(
    secret: str, depth: int, says: str
) -> None:
    response = post(
        Client(), proto_request(unchanged, proto_nested(depth)), secret=secret,
        content_type="application/x-protobuf",
    )  # fmt: skip
    assert response.status_code == 400, response.content
    assert says in response.json()["error"]["message"]
    assert nothing_stored()


def test_non_finite_doubles_and_the_last_representable_time_are_stored(
    secret: str,
) -> None:
    """Valid OTLP, kept: NaN as its name (JSON columns cannot hold NaN), and a
    fixed64 time at its maximum (year 2554)."""

    def change(span: Any) -> None:
        span.attributes.append(
            KeyValue(key="score", value=AnyValue(double_value=float("nan")))
        )
        span.end_time_unix_nano = 2**64 - 1

    response = post(
        Client(), proto_request(change), secret=secret,
        content_type="application/x-protobuf",
    )  # fmt: skip
    assert response.status_code == 200, response.content
    last = Span.objects.get(span_id=f"{3:016x}")
    assert last.attributes["score"] == "NaN"
    assert last.ended_at is not None and last.ended_at.year == 2554


def test_a_payload_of_json_text_nested_past_any_walk_is_stored_as_text(
    secret: str, tenant: Any
) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    body = with_last_span(
        attribute("input.value", {"stringValue": deep}),
    )
    response = post(Client(), body, secret=secret)
    assert response.status_code == 200, response.content
    last = Span.objects.get(span_id=f"{3:016x}")
    stored = span_payloads(tenant=tenant, span=last)["gen_ai.input.messages"]
    assert json.loads(stored) == deep


def test_a_runs_token_totals_stop_at_the_columns_maximum(
    secret: str, tenant: Any
) -> None:
    """Counts in range, repeated by a sender as often as it likes, never
    overflow the run's 64-bit totals (a 500 on PostgreSQL, on SQLite too)."""
    assert (
        post(Client(), with_last_span(unchanged_json), secret=secret).status_code == 200
    )
    run = Run.objects.get(tenant=tenant, stop_reason="external")
    Run.objects.filter(id=run.id).update(input_tokens=2**63 - 2)
    again = otlp_json(1, trace_id="6b8efff798038103d269b633813fc60c")
    # The same run: a second request of its trace.
    again["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = run.trace_id
    again["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = f"{9:016x}"
    response = post(Client(), json.dumps(again).encode(), secret=secret)
    assert response.status_code == 200, response.content
    run.refresh_from_db()
    assert run.input_tokens == 2**63 - 1
