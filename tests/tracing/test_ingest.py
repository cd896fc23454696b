"""POST /v1/traces: the real OTLP/HTTP exporter in, read-only external runs out."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from django.test import Client
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

from controlplane.services import api_token_issue
from runs.models import Run
from tracing.models import RunEvent, Span
from tracing.selectors import span_payloads


@pytest.fixture
def secret(admin_user: Any, tenant: Any) -> str:
    return api_token_issue(tenant=tenant, user=admin_user).secret


def emit_agent_trace(endpoint: str, secret: str) -> str:
    """An agent instrumented elsewhere: OpenInference, Traceloop and GenAI names."""
    exporter = OTLPSpanExporter(
        endpoint=endpoint,
        headers={"Authorization": f"Bearer {secret}"},
        compression=Compression.Gzip,
    )
    provider = TracerProvider(resource=Resource.create({"service.name": "support-bot"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("elsewhere")
    with tracer.start_as_current_span(
        "agent run",
        attributes={
            "openinference.span.kind": "AGENT",
            "agent.name": "support-bot",
            "input.value": "Where is my order?",
            "output.value": "It ships tomorrow.",
        },
    ) as root:
        with tracer.start_as_current_span(
            "ChatCompletion",
            attributes={
                "openinference.span.kind": "LLM",
                "llm.model_name": "gpt-4.1-mini",
                "llm.provider": "openai",
                "llm.token_count.prompt": 120,
                "llm.token_count.completion": 30,
                "input.value": json.dumps([{"role": "user", "content": "Where?"}]),
            },
        ):
            pass
        with tracer.start_as_current_span(
            "openai.chat",
            attributes={
                "gen_ai.system": "openai",
                "llm.request.type": "chat",
                "gen_ai.request.model": "gpt-4.1",
                "gen_ai.usage.prompt_tokens": 7,
                "gen_ai.usage.completion_tokens": 5,
                "gen_ai.prompt.0.role": "user",
                "gen_ai.prompt.0.content": "key sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX",
                "gen_ai.completion.0.role": "assistant",
                "gen_ai.completion.0.content": "ok",
                "gen_ai.completion.0.finish_reason": "stop",
            },
        ):
            pass
        with tracer.start_as_current_span(
            "lookup_order.tool",
            attributes={
                "traceloop.span.kind": "tool",
                "traceloop.entity.name": "lookup_order",
                "traceloop.entity.input": json.dumps({"order": "KC-1"}),
                "traceloop.entity.output": json.dumps({"status": "shipped"}),
            },
        ) as tool:
            tool.set_status(Status(StatusCode.ERROR, "timeout"))
        trace_id = f"{root.get_span_context().trace_id:032x}"
    provider.shutdown()
    return trace_id


@pytest.mark.django_db(transaction=True)
def test_the_real_otlp_exporter_produces_an_external_run_with_the_same_tree(
    live_server: Any, secret: str, tenant: Any
) -> None:
    trace_id = emit_agent_trace(f"{live_server.url}/v1/traces", secret)
    run = Run.objects.get(tenant=tenant, trace_id=trace_id)
    assert run.stop_reason == "external" and run.is_terminal
    assert run.agent.slug == "external-support-bot"
    assert run.step_token is None and run.lease_owner == ""
    spans = {span.name: span for span in Span.objects.filter(run=run)}
    assert set(spans) == {
        "agent run",
        "ChatCompletion",
        "openai.chat",
        "lookup_order.tool",
    }
    root = spans["agent run"]
    assert root.parent_span_id == ""
    assert {spans[n].parent_span_id for n in spans if n != "agent run"} == {
        root.span_id
    }
    oi, tl, tool = (
        spans["ChatCompletion"],
        spans["openai.chat"],
        spans["lookup_order.tool"],
    )
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.agent.name"] == "support-bot"
    assert {k: oi.attributes.get(k) for k in (
        "gen_ai.operation.name", "gen_ai.request.model", "gen_ai.provider.name",
        "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")} == {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4.1-mini",
        "gen_ai.provider.name": "openai", "gen_ai.usage.input_tokens": 120,
        "gen_ai.usage.output_tokens": 30}  # fmt: skip
    assert {k: tl.attributes.get(k) for k in (
        "gen_ai.operation.name", "gen_ai.request.model", "gen_ai.provider.name",
        "gen_ai.usage.input_tokens", "gen_ai.response.finish_reasons")} == {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4.1",
        "gen_ai.provider.name": "openai", "gen_ai.usage.input_tokens": 7,
        "gen_ai.response.finish_reasons": ["stop"]}  # fmt: skip
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "lookup_order"
    assert tool.status == "error" and tool.status_message == "timeout"
    payloads = span_payloads(tenant=tenant, span=tool)
    assert json.loads(payloads["gen_ai.tool.call.arguments"]) == {"order": "KC-1"}
    assert json.loads(payloads["gen_ai.tool.call.result"]) == {"status": "shipped"}
    prompt = json.loads(span_payloads(tenant=tenant, span=tl)["gen_ai.input.messages"])
    assert prompt == [{"role": "user", "content": "key [REDACTED]"}]
    assert json.loads(
        span_payloads(tenant=tenant, span=oi)["gen_ai.input.messages"]
    ) == [{"role": "user", "content": "Where?"}]
    assert run.input == "Where is my order?"
    assert run.final_answer == "It ships tomorrow."
    assert run.input_tokens == 127 and run.output_tokens == 35
    seqs = list(RunEvent.objects.filter(run=run).values_list("seq", flat=True))
    assert seqs == list(range(1, 5))


def otlp_json(
    spans: int = 1, trace_id: str = "5b8efff798038103d269b633813fc60c"
) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [
                    {"key": "service.name", "value": {"stringValue": "json-agent"}}]},
                "scopeSpans": [{"spans": [
                    {
                        "traceId": trace_id,
                        "spanId": f"{i + 1:016x}",
                        "parentSpanId": "" if i == 0 else f"{1:016x}",
                        "name": f"span {i}",
                        "kind": 1,
                        "startTimeUnixNano": "1700000000000000000",
                        "endTimeUnixNano": "1700000001000000000",
                        "attributes": [
                            {"key": "gen_ai.operation.name",
                             "value": {"stringValue": "chat"}},
                            {"key": "gen_ai.usage.input_tokens",
                             "value": {"intValue": "4"}},
                        ],
                        "status": {"code": 1},
                    }
                    for i in range(spans)
                ]}],
            }
        ]
    }  # fmt: skip


def post(client: Client, body: bytes, *, secret: str | None, **headers: str) -> Any:
    extra = {"HTTP_AUTHORIZATION": f"Bearer {secret}"} if secret else {}
    for name, value in headers.items():
        extra[f"HTTP_{name.upper()}"] = value
    content_type = extra.pop("HTTP_CONTENT_TYPE", "application/json")
    return client.post("/v1/traces", body, content_type=content_type, **extra)


def test_otlp_json_with_gzip_is_accepted(secret: str, tenant: Any) -> None:
    body = gzip.compress(json.dumps(otlp_json(3)).encode())
    response = post(Client(), body, secret=secret, content_encoding="gzip")
    assert response.status_code == 200, response.content
    run = Run.objects.get(tenant=tenant, stop_reason="external")
    assert run.spans.count() == 3
    assert run.input_tokens == 12


@pytest.mark.parametrize(
    ("secret_value", "status"), [(None, 401), ("cp_not-a-real-token", 401)]
)
def test_a_missing_or_bad_token_is_401_and_nothing_is_stored(
    tenant: Any, secret_value: str | None, status: int
) -> None:
    response = post(Client(), json.dumps(otlp_json()).encode(), secret=secret_value)
    assert response.status_code == status
    assert response.json()["error"]["code"] == "unauthenticated"
    assert not Span.objects.exists() and not Run.objects.exists()


def test_a_viewer_token_may_not_write_traces(viewer_user: Any, tenant: Any) -> None:
    viewer = api_token_issue(tenant=tenant, user=viewer_user).secret
    response = post(Client(), json.dumps(otlp_json()).encode(), secret=viewer)
    assert response.status_code == 403
    assert not Span.objects.exists()


@pytest.mark.parametrize(
    ("body", "headers", "status", "says"),
    [
        (
            b"\x0a\xff\xff\xff",
            {"content_type": "application/x-protobuf"},
            400,
            "protobuf",
        ),
        (b"{not json", {}, 400, "not JSON"),
        (b'{"resourceSpans": 3}', {}, 400, "resourceSpans"),
        (json.dumps(otlp_json(trace_id="00" * 16)).encode(), {}, 400, "traceId"),
        (b"{}", {"content_type": "text/plain"}, 415, "Content-Type"),
        (b"not gzip", {"content_encoding": "gzip"}, 400, "gzip"),
    ],
)
def test_malformed_requests_are_refused_and_nothing_is_stored(
    secret: str, body: bytes, headers: dict[str, str], status: int, says: str
) -> None:
    response = post(Client(), body, secret=secret, **headers)
    assert response.status_code == status
    assert says in response.json()["error"]["message"]
    assert not Span.objects.exists() and not Run.objects.exists()


def test_too_many_spans_is_413_naming_the_limit(secret: str, settings: Any) -> None:
    settings.OTLP_INGEST_MAX_SPANS = 5
    response = post(Client(), json.dumps(otlp_json(6)).encode(), secret=secret)
    assert response.status_code == 413
    assert "OTLP_INGEST_MAX_SPANS=5" in response.json()["error"]["message"]
    assert not Span.objects.exists()


def test_a_body_over_the_limit_is_413_even_when_it_inflates_from_gzip(
    secret: str, settings: Any
) -> None:
    settings.OTLP_INGEST_MAX_BYTES = 4096
    big = json.dumps(otlp_json(40)).encode()
    assert len(big) > 4096
    plain = post(Client(), big, secret=secret)
    assert plain.status_code == 413
    assert "OTLP_INGEST_MAX_BYTES=4096" in plain.json()["error"]["message"]
    bomb = gzip.compress(b'{"resourceSpans": [' + b" " * 2_000_000 + b"]}")
    assert len(bomb) < 4096
    inflated = post(Client(), bomb, secret=secret, content_encoding="gzip")
    assert inflated.status_code == 413
    assert "decompressed" in inflated.json()["error"]["message"]
    assert not Span.objects.exists()


def test_the_events_and_spans_apis_page_through_a_trace(
    secret: str, tenant: Any, admin_user: Any, api_client_for: Any, other_tenant: Any,
    make_member: Any,
) -> None:  # fmt: skip
    assert (
        post(Client(), json.dumps(otlp_json(30)).encode(), secret=secret).status_code
        == 200
    )
    run = Run.objects.get(tenant=tenant, stop_reason="external")
    client = api_client_for(admin_user, tenant)
    page = client.get(f"/api/v1/runs/{run.id}/events/?after_seq=10&limit=15").json()
    assert [e["seq"] for e in page["events"]] == list(range(11, 26))
    assert page["next_after_seq"] == 25
    roots = client.get(f"/api/v1/runs/{run.id}/spans/").json()
    assert roots["count"] == 1
    root = roots["results"][0]
    children = client.get(
        f"/api/v1/runs/{run.id}/spans/?parent={root['span_id']}&limit=10&offset=20"
    ).json()
    assert children["count"] == 29 and len(children["results"]) == 9
    assert children["next_offset"] is None
    detail = client.get(f"/api/v1/spans/{root['id']}/").json()
    assert detail["span_id"] == root["span_id"] and detail["run_id"] == str(run.id)
    for bad in ("-1", "x", "1.5"):
        response = client.get(f"/api/v1/runs/{run.id}/events/?after_seq={bad}")
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid"
    stranger = make_member(other_tenant, "mallory", "admin")
    theirs = api_client_for(stranger, other_tenant)
    assert theirs.get(f"/api/v1/runs/{run.id}/events/").status_code == 404
    assert theirs.get(f"/api/v1/runs/{run.id}/spans/").status_code == 404
    assert theirs.get(f"/api/v1/spans/{root['id']}/").status_code == 404
