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


def test_a_page_of_children_says_which_spans_are_leaves(
    tenant: Any, operator_user: Any, api_client_for: Any
) -> None:
    trace = store_trace(tenant=tenant, user=operator_user)
    client = api_client_for(operator_user, tenant)
    url = f"/api/v1/runs/{trace.run.id}/spans/"
    [root] = client.get(url, {"parent": ""}).json()["results"]
    assert root["span_id"] == trace.root.span_id and root["has_children"] is True
    steps = client.get(url, {"parent": trace.root.span_id}).json()["results"]
    assert len(steps) == 8 and all(s["has_children"] for s in steps)
    below = client.get(url, {"parent": trace.steps[0].span_id}).json()["results"]
    parents = set(
        Span.objects.filter(run=trace.run).values_list("parent_span_id", flat=True)
    )
    assert below and all(s["has_children"] == (s["span_id"] in parents) for s in below)
    assert any(s["has_children"] is False for s in below)


def test_a_first_answer_cut_to_a_few_matches_still_counts_them_all_and_the_rest_follow(
    tenant: Any, other_tenant: Any, operator_user: Any, make_member: Any,
    api_client_for: Any,
) -> None:  # fmt: skip
    # The page asks for the first few hits (what the screen shows), draws, then
    # asks for the rest from where the first answer stopped.
    trace = store_trace(tenant=tenant, user=operator_user, steps=8, tools=3)
    client = api_client_for(operator_user, tenant)
    whole = search(client, trace.run.id, q="lookup_order #").json()
    assert whole["count"] == 24 and len(whole["matches"]) == 24

    first = search(client, trace.run.id, q="lookup_order #", limit=5).json()
    assert first["count"] == 24 and first["truncated"] is True
    assert first["matches"] == whole["matches"][:5]
    # Only the spans it names travel: the five matches and their ancestors.
    sent = {s["span_id"] for s in first["spans"]}
    assert sent == {
        span_id for m in first["matches"] for span_id in (*m["path"], m["span_id"])
    }
    rest = search(client, trace.run.id, q="lookup_order #", offset=5, limit=200).json()
    assert rest["count"] == 24 and rest["truncated"] is False
    assert first["matches"] + rest["matches"] == whole["matches"]
    assert {s["span_id"] for s in rest["spans"]} >= {
        span_id for m in rest["matches"] for span_id in (*m["path"], m["span_id"])
    }
    # Past the end: no match, the count unchanged.
    beyond = search(client, trace.run.id, q="lookup_order #", offset=24).json()
    assert beyond == {"count": 24, "truncated": False, "matches": [], "spans": []}
    # A cut answer by status counts every error too.
    errors = search(client, trace.run.id, status="error", limit=1).json()
    assert errors["count"] == 1 and errors["truncated"] is False

    for bad in ("-1", "x", "20001"):
        answer = search(client, trace.run.id, q="lookup", offset=bad)
        assert answer.status_code == 400 and "offset" in str(answer.json()), bad
    # Another tenant's run is not found, however it is asked for.
    stranger = make_member(other_tenant, "olga-other", "admin")
    other = api_client_for(stranger, other_tenant)
    answer = search(other, trace.run.id, q="lookup_order #", limit=5, offset=5)
    assert answer.status_code == 404
    assert "lookup_order" not in answer.content.decode()


def test_search_orders_hits_under_a_parent_cycle_and_a_missing_parent(
    tenant: Any, operator_user: Any, api_client_for: Any
) -> None:
    # Ingested spans may name parents that form a cycle or were never sent: the
    # search still answers, each hit once, with a path that ends.
    import datetime as dt

    trace = store_trace(
        tenant=tenant, user=operator_user, steps=3, tools=1, error_step=1
    )
    at = trace.root.started_at + dt.timedelta(seconds=1)

    def span(span_id: str, parent: str, name: str, seconds: int) -> Span:
        return Span.objects.create(
            run=trace.run, trace_id=trace.run.trace_id, span_id=span_id,
            parent_span_id=parent, name=name, status=Span.Status.OK,
            started_at=at + dt.timedelta(seconds=seconds), attributes={},
        )  # fmt: skip

    span("a" * 16, "b" * 16, "loopy one", 2)
    span("b" * 16, "a" * 16, "loopy two", 1)
    span("c" * 16, "a" * 16, "loopy child", 3)
    span("d" * 16, "e" * 16, "loopy orphan", 0)
    client = api_client_for(operator_user, tenant)
    found = search(client, trace.run.id, q="loopy").json()
    assert found["count"] == 4
    paths = {m["span_id"]: m["path"] for m in found["matches"]}
    assert paths == {
        "a" * 16: ["b" * 16],
        "b" * 16: ["a" * 16],
        "c" * 16: ["b" * 16, "a" * 16],
        "d" * 16: [],
    }
    # Depth first, siblings by start, each placed by its path: the orphan (a
    # root, first to start); a under b (b started first), then c under b and a;
    # b under a last.
    order = [m["span_id"] for m in found["matches"]]
    assert order == ["d" * 16, "a" * 16, "c" * 16, "b" * 16]
    cut = search(client, trace.run.id, q="loopy", limit=2, offset=1).json()
    assert [m["span_id"] for m in cut["matches"]] == order[1:3]
    assert cut["count"] == 4 and cut["truncated"] is True


def test_the_text_match_is_answered_by_the_trigram_index_on_postgresql(
    tenant: Any, operator_user: Any
) -> None:
    # The index's expressions must be the ones Django writes for the lookups
    # (tracing/migrations/0005): spelled otherwise, PostgreSQL reads every span
    # of the run again. Here a run has 43 spans, so the planner would rightly
    # read them by run; with the run's indexes dropped (inside this test's
    # transaction) and no table scan allowed, it must find the trigram index
    # for each arm of the match.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tracing.tree import span_search

    if connection.vendor != "postgresql":
        pytest.skip("the trigram index is PostgreSQL's; SQLite scans the run")
    trace = store_trace(tenant=tenant, user=operator_user, steps=8, tools=3)
    with CaptureQueriesContext(connection) as seen:
        found = span_search(run_id=trace.run.id, text="KC-1031")
    assert found.count == 1
    [match] = [q["sql"] for q in seen.captured_queries if " LIKE " in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the rows' FK checks now
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'tracing_span' "
            "AND indexname NOT IN ('tracing_span_pkey', 'tracing_span_text_trgm')"
        )
        for (name,) in cursor.fetchall():
            constraint = "one_span_per_run"
            cursor.execute(
                f"ALTER TABLE tracing_span DROP CONSTRAINT {name}"
                if name == constraint
                else f"DROP INDEX {name}"
            )
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {match}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert plan.count("Bitmap Index Scan on tracing_span_text_trgm") == 4, plan
