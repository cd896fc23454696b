"""Search over a run's whole trace (names, attribute values, status), the path
to one span for a deep link, and a subtree's totals: what the run page asks the
server when a large trace is not all loaded."""

from __future__ import annotations

from typing import Any

import pytest

from tests.tracing.stored_trace import store_trace
from tracing.models import Span

pytestmark = pytest.mark.django_db


def search(client: Any, run_id: Any, **params: Any) -> Any:
    return client.get(f"/api/v1/runs/{run_id}/spans/search/", params)


def test_search_finds_by_name_attribute_value_and_status_in_row_order_with_paths(
    tenant: Any, operator_user: Any, api_client_for: Any
) -> None:
    trace = store_trace(tenant=tenant, user=operator_user, steps=8, tools=3)
    client = api_client_for(operator_user, tenant)

    by_name = search(client, trace.run.id, q="WAREHOUSE").json()
    assert by_name["count"] == 1 and not by_name["truncated"]
    [match] = by_name["matches"]
    assert match["span_id"] == trace.failed.span_id
    step = trace.steps[6]
    tool = Span.objects.get(run=trace.run, span_id=trace.failed.parent_span_id)
    assert match["path"] == [trace.root.span_id, step.span_id, tool.span_id]
    # Every span on the path comes along, so the browser can draw it in place.
    assert {s["span_id"] for s in by_name["spans"]} == {
        trace.root.span_id, step.span_id, tool.span_id, trace.failed.span_id,
    }  # fmt: skip

    # An attribute's value, not its key: "order_id" is only ever a key.
    by_value = search(client, trace.run.id, q="KC-1031").json()
    [hit] = by_value["matches"]
    shown = next(s for s in by_value["spans"] if s["span_id"] == hit["span_id"])
    assert shown["attributes"]["cp.tool.order_id"] == "KC-1031"
    assert hit["path"] == [trace.root.span_id, trace.steps[3].span_id]
    assert search(client, trace.run.id, q="cp.tool.order_id").json()["count"] == 0

    # Status: errors (the failed span only), in the tree's row order.
    errors = search(client, trace.run.id, status="error").json()
    assert [m["span_id"] for m in errors["matches"]] == [trace.failed.span_id]
    tools = search(client, trace.run.id, q="lookup_order #").json()
    assert tools["count"] == 8 * 3
    starts = [
        s["started_at"] for s in tools["spans"] if s["name"].startswith("execute")
    ]
    assert starts == sorted(starts)

    # A deep link: one span by id, with its path.
    link = search(client, trace.run.id, span_id=trace.approval.span_id).json()
    assert link["matches"] == [
        {"span_id": trace.approval.span_id,
         "path": [trace.root.span_id, trace.steps[2].span_id]}
    ]  # fmt: skip


def test_search_refuses_bad_input_by_field_and_other_tenants_runs(
    tenant: Any, other_tenant: Any, operator_user: Any, make_member: Any,
    api_client_for: Any,
) -> None:  # fmt: skip
    trace = store_trace(
        tenant=tenant, user=operator_user, steps=3, tools=1, error_step=1
    )
    client = api_client_for(operator_user, tenant)
    for params, field in [
        ({}, "q"), ({"q": "x" * 201}, "q"), ({"status": "broken"}, "status"),
        ({"span_id": "nothex"}, "span_id"), ({"q": "a", "limit": "-1"}, "limit"),
    ]:  # fmt: skip
        answer = search(client, trace.run.id, **params)
        assert answer.status_code == 400, params
        assert field in str(answer.json()), params
    stranger = make_member(other_tenant, "otto-other", "admin")
    other = api_client_for(stranger, other_tenant)
    assert search(other, trace.run.id, q="step").status_code == 404
    assert other.get(f"/api/v1/spans/{trace.root.pk}/subtree/").status_code == 404


def test_subtree_totals_count_each_model_call_once_and_the_wait_for_a_person(
    tenant: Any, operator_user: Any, api_client_for: Any
) -> None:
    trace = store_trace(
        tenant=tenant, user=operator_user, steps=4, tools=2, error_step=3
    )
    client = api_client_for(operator_user, tenant)
    root = client.get(f"/api/v1/spans/{trace.root.pk}/subtree/").json()
    # The root's own usage attribute is a run total: counted through its chats.
    assert root["input_tokens"] == sum(100 + i for i in range(4))
    assert root["output_tokens"] == 40
    assert root["model_calls"] == 4 and root["tool_calls"] == 8
    assert root["errors"] == 1
    assert root["cost"] == "0.040000"
    assert root["waiting_ms"] == 60_000
    assert root["spans"] == Span.objects.filter(run=trace.run).count()
    step = client.get(f"/api/v1/spans/{trace.steps[2].pk}/subtree/").json()
    assert step["input_tokens"] == 102 and step["cost"] == "0.010000"
    assert step["waiting_ms"] == 60_000 and step["errors"] == 0
    assert step["model_ms"] == 800 and step["tool_ms"] == 600
