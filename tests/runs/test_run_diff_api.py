"""GET /api/v1/runs/<a>/diff/<b>/: two runs of the tenant aligned by meaning,
another tenant's run is 404 naming the side, the same run twice is 400, and a
run sent over OTLP diffs against a native one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from controlplane.services import api_token_issue
from runs.demo import demo_seed_shop
from runs.models import Agent, Run
from tests.run_diff_data import Call, Reply, demo_replies, seed_recorded_run


def url(a: Any, b: Any) -> str:
    return f"/api/v1/runs/{a}/diff/{b}/"


@pytest.fixture
def agent(tenant: Any) -> Agent:
    demo_seed_shop(tenant=tenant)
    return Agent.objects.get(tenant=tenant, slug="kettlecraft-support")


def test_two_demo_runs_align_by_meaning_with_the_first_divergence(
    agent: Agent, viewer_user: Any, tenant: Any, api_client_for: Any
) -> None:
    good = seed_recorded_run(agent, demo_replies())
    # The other run looks up the wrong order, ships nothing, and answers otherwise.
    bad = seed_recorded_run(agent, demo_replies(order_id="4812", replace=False))
    response = api_client_for(viewer_user, tenant).get(url(good.id, bad.id))
    assert response.status_code == 200, response.content
    body = response.json()
    assert [p["kind"] for p in body["pairs"]] == [
        "changed", "skipped", "changed", "changed",
    ]  # fmt: skip
    lookup = body["pairs"][0]
    assert lookup["left"]["calls"][0]["arguments"] == {"order_id": "4821"}
    assert lookup["right"]["calls"][0]["arguments"] == {"order_id": "4812"}
    assert lookup["argument_changes"] == [
        [{"path": "order_id", "op": "changed", "left": "4821", "right": "4812"}]
    ]
    skipped = body["pairs"][1]
    assert skipped["right"] is None
    assert skipped["left"]["calls"][0]["tool"] == "create_replacement"
    assert body["pairs"][3]["reasons"] == ["final answer differs"]
    assert body["first_divergence"] == {
        "pair": 0,
        "left_index": 0,
        "right_index": 0,
        "reason": "lookup_order arguments differ (order_id)",
    }
    assert body["counts"] == {"same": 0, "changed": 3, "inserted": 0, "skipped": 1}
    assert body["totals_delta"]["steps"] == -1
    assert body["totals_delta"]["tool_calls"] == -1
    assert body["totals_delta"]["input_tokens"] == -400
    assert (
        body["left"]["totals"]["steps"] == 4 and body["right"]["totals"]["steps"] == 3
    )
    # The model input delta: step 1 read the lookup's result, step 0 the input.
    assert lookup["left"]["input_delta"] == [
        "user: Order #4821 arrived with a dented spout."
    ]
    assert body["pairs"][2]["left"]["input_delta"] == [
        'tool create_replacement: {"ok":true}'
    ]
    assert body["pairs"][2]["input_differs"] is True
    assert lookup["left"]["latency_ms"] == 800.0
    assert lookup["left"]["cost"] == "0.000880"


def test_identical_runs_have_no_divergence(
    agent: Agent, operator_user: Any, tenant: Any, api_client_for: Any
) -> None:
    a = seed_recorded_run(agent, demo_replies())
    b = seed_recorded_run(agent, demo_replies())
    body = api_client_for(operator_user, tenant).get(url(a.id, b.id)).json()
    assert body["first_divergence"] is None
    assert {p["kind"] for p in body["pairs"]} == {"same"}
    assert body["totals_delta"]["steps"] == 0 and body["totals_delta"]["cost"] == (
        "0.000000"
    )


def test_another_tenants_run_is_404_naming_the_side_and_shows_nothing(
    agent: Agent, operator_user: Any, tenant: Any, other_tenant: Any,
    api_client_for: Any,
) -> None:  # fmt: skip
    mine = seed_recorded_run(agent, demo_replies())
    demo_seed_shop(tenant=other_tenant)
    theirs = seed_recorded_run(
        Agent.objects.get(tenant=other_tenant, slug="kettlecraft-support"),
        [Reply("secret plan", [Call("refund", {"order_id": "9"})]), Reply("done")],
    )
    client = api_client_for(operator_user, tenant)
    right = client.get(url(mine.id, theirs.id))
    assert right.status_code == 404
    assert right.json()["error"]["run"] == "right"
    assert "right run" in right.json()["error"]["message"]
    assert "secret plan" not in right.content.decode()
    left = client.get(url(theirs.id, mine.id))
    assert left.status_code == 404 and left.json()["error"]["run"] == "left"
    assert client.get(url("not-a-run", mine.id)).json()["error"]["run"] == "left"


def test_the_same_run_twice_is_400(
    agent: Agent, operator_user: Any, tenant: Any, api_client_for: Any
) -> None:
    run = seed_recorded_run(agent, demo_replies())
    response = api_client_for(operator_user, tenant).get(url(run.id, run.id))
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {
        "other_id": ["compare a run with another run"]
    }


def test_a_member_of_no_tenant_reads_nothing(
    agent: Agent, operator_user: Any, tenant: Any, other_tenant: Any,
    make_member: Any, api_client_for: Any,
) -> None:  # fmt: skip
    a = seed_recorded_run(agent, demo_replies())
    b = seed_recorded_run(agent, demo_replies(replace=False))
    outsider = make_member(other_tenant, "otto-outsider", "admin")
    response = api_client_for(outsider, other_tenant).get(url(a.id, b.id))
    assert response.status_code == 404
    assert response.json()["error"]["run"] == "left"


def emit_external_run(endpoint: str, secret: str) -> str:
    """An agent instrumented elsewhere (GenAI names): looks the order up, then
    answers; the model's messages are on the chat spans."""
    exporter = OTLPSpanExporter(
        endpoint=endpoint, headers={"Authorization": f"Bearer {secret}"}
    )
    provider = TracerProvider(resource=Resource.create({"service.name": "bot"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("elsewhere")
    user = {"role": "user", "content": "Order #4821 arrived with a dented spout."}
    with tracer.start_as_current_span(
        "invoke_agent bot",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.output.messages": json.dumps(
                [{"role": "assistant", "content": "Sorry! It arrives Monday."}]
            ),
        },
    ) as root:
        with tracer.start_as_current_span(
            "chat gpt-4.1",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4.1",
                "gen_ai.usage.input_tokens": 300,
                "gen_ai.usage.output_tokens": 20,
                "gen_ai.input.messages": json.dumps([user]),
            },
        ):
            pass
        with tracer.start_as_current_span(
            "execute_tool lookup_order",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "lookup_order",
                "gen_ai.tool.call.arguments": json.dumps({"order_id": "4821"}),
                "gen_ai.tool.call.result": json.dumps({"status": "delivered"}),
            },
        ):
            pass
        with tracer.start_as_current_span(
            "chat gpt-4.1",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4.1",
                "gen_ai.usage.input_tokens": 350,
                "gen_ai.usage.output_tokens": 15,
                "gen_ai.input.messages": json.dumps(
                    [user, {"role": "tool", "content": '{"status":"delivered"}'}]
                ),
            },
        ):
            pass
        trace_id = f"{root.get_span_context().trace_id:032x}"
    provider.shutdown()
    return trace_id


@pytest.mark.django_db(transaction=True)
def test_a_run_sent_over_otlp_diffs_against_a_native_run(
    live_server: Any, agent: Agent, admin_user: Any, tenant: Any,
    api_client_for: Any,
) -> None:  # fmt: skip
    secret = api_token_issue(tenant=tenant, user=admin_user).secret
    trace_id = emit_external_run(f"{live_server.url}/v1/traces", secret)
    external = Run.objects.get(tenant=tenant, trace_id=trace_id)
    native = seed_recorded_run(agent, demo_replies())
    response = api_client_for(admin_user, tenant).get(url(native.id, external.id))
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["right"]["external"] is True and body["left"]["external"] is False
    pairs = body["pairs"]
    # Same tool, same arguments; what it read back differs.
    assert [p["kind"] for p in pairs] == ["changed", "skipped", "skipped", "changed"]
    assert pairs[0]["reasons"] == ["lookup_order observation differs"]
    lookup = pairs[0]["right"]
    assert lookup["model"] == "gpt-4.1"
    assert lookup["calls"] == [
        {
            "tool": "lookup_order",
            "arguments": {"order_id": "4821"},
            "status": "succeeded",
            "observation": '{"status": "delivered"}',
        }
    ]
    assert lookup["input_tokens"] == 300
    assert lookup["input_delta"] == ["user: Order #4821 arrived with a dented spout."]
    answer = pairs[3]["right"]
    assert answer["action"] == "final_answer"
    assert answer["text"] == external.final_answer
    assert answer["input_delta"] == ['tool: {"status":"delivered"}']
    assert pairs[3]["reasons"] == ["final answer differs"]
    assert body["first_divergence"]["reason"] == "lookup_order observation differs"
