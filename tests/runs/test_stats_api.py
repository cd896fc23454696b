"""GET /api/v1/stats/: the dashboard's aggregates, computed by the database over
the caller's tenant only, checked against the rows themselves."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest
from controlplane.models import Role
from runs.demo import demo_seed_shop
from runs.models import Agent, Run, ToolCall
from runs.services import run_start
from runs.services.decide import approval_decide


def _demo_run(agent: Agent, user: Any, drive_run: Any, *, approve: bool) -> Run:
    run = run_start(tenant=agent.tenant, agent_slug=agent.slug,
                    input="order 4821 arrived damaged", started_by=user)  # fmt: skip
    run = drive_run(run)
    assert run.status == Run.Status.WAITING_APPROVAL
    approval_decide(
        request=ApprovalRequest.objects.get(run=run), decided_by=user,
        approve=approve, reason="" if approve else "refunded already",
    )  # fmt: skip
    return drive_run(run)


@pytest.fixture
def two_tenants(
    demo_agent: Agent, other_tenant: Any, operator_user: Any, make_member: Any,
    drive_run: Any,
) -> dict[str, Any]:  # fmt: skip
    approved = _demo_run(demo_agent, operator_user, drive_run, approve=True)
    denied = _demo_run(demo_agent, operator_user, drive_run, approve=False)
    demo_seed_shop(tenant=other_tenant)
    other_agent = Agent.objects.get(tenant=other_tenant, slug=demo_agent.slug)
    other_user = make_member(other_tenant, "olga-other", Role.OPERATOR)
    for _ in range(3):
        _demo_run(other_agent, other_user, drive_run, approve=True)
    return {"runs": [approved, denied], "other_user": other_user}


def test_stats_are_the_tenants_aggregates(
    two_tenants: dict[str, Any], operator_user: Any, tenant: Any, api_client_for: Any
) -> None:
    runs = Run.objects.filter(tenant=tenant)
    assert runs.count() == 2
    response = api_client_for(operator_user, tenant).get("/api/v1/stats/")
    assert response.status_code == 200, response.content
    stats = response.json()

    assert stats["runs"] == 2 and stats["ended"] == 2
    assert stats["succeeded"] == 1
    assert stats["success_rate"] == 0.5
    assert stats["by_status"]["succeeded"] == 1
    assert stats["by_status"]["failed"] == 1
    assert stats["input_tokens"] == sum(r.input_tokens for r in runs)
    assert stats["output_tokens"] == sum(r.output_tokens for r in runs)
    assert Decimal(stats["cost"]) == sum((r.cost for r in runs), Decimal(0))
    assert stats["per_task"]["turns"] == sum(r.steps for r in runs) / 2
    assert stats["per_task"]["tool_calls"] == sum(r.tool_calls for r in runs) / 2
    (agent,) = stats["agents"]
    assert agent["agent"] == "kettlecraft-support"
    assert agent["runs"] == 2 and agent["success_rate"] == 0.5

    tools = {row["tool"]: row for row in stats["tools"]}
    calls = ToolCall.objects.filter(run__tenant=tenant)
    for name, row in tools.items():
        mine = calls.filter(tool_name=name)
        assert row["calls"] == mine.count()
        errors = mine.filter(status__in=["failed", "unknown"]).count()
        assert row["errors"] == errors
        assert row["error_rate"] == round(errors / mine.count(), 4)
    assert tools["create_replacement"]["denied"] == 1
    assert tools["lookup_order"]["calls"] == 2

    assert stats["human_interventions"] == {
        "requests": 2,
        "runs_with_requests": 2,
        "decisions": 2,
        "approvals": 1,
        "denials": 1,
        "edited": 0,
    }


def test_another_tenant_sees_only_its_own_runs(
    two_tenants: dict[str, Any], other_tenant: Any, api_client_for: Any
) -> None:
    client = api_client_for(two_tenants["other_user"], other_tenant)
    stats = client.get("/api/v1/stats/").json()
    assert stats["runs"] == 3 and stats["succeeded"] == 3
    assert stats["success_rate"] == 1.0
    assert stats["human_interventions"]["decisions"] == 3
    assert stats["human_interventions"]["denials"] == 0
    mine = Run.objects.filter(tenant=other_tenant)
    assert stats["input_tokens"] == sum(r.input_tokens for r in mine)
    # A token pins its tenant: naming the other one changes nothing.
    pinned = client.get("/api/v1/stats/", HTTP_X_TENANT="kettlecraft")
    assert pinned.status_code == 200
    assert pinned.json()["runs"] == 3
    # A session asking for a tenant it is not a member of is refused.
    session = APIClient()
    session.force_login(two_tenants["other_user"])
    refused = session.get("/api/v1/stats/", HTTP_X_TENANT="kettlecraft")
    assert refused.status_code == 403
    assert "runs" not in refused.json()
    assert refused.json()["error"]["code"]


def test_since_limits_the_window_and_a_bad_since_is_a_400(
    two_tenants: dict[str, Any], operator_user: Any, tenant: Any, api_client_for: Any
) -> None:
    client = api_client_for(operator_user, tenant)
    future = (timezone.now() + dt.timedelta(hours=1)).isoformat()
    empty = client.get("/api/v1/stats/", {"since": future}).json()
    assert empty["runs"] == 0 and empty["success_rate"] is None
    assert empty["tools"] == [] and empty["agents"] == []
    assert empty["per_task"]["turns"] is None
    past = client.get("/api/v1/stats/", {"since": "2000-01-01T00:00:00+00:00"})
    assert past.json()["runs"] == 2
    naive = client.get("/api/v1/stats/", {"since": "2000-01-01T00:00:00"})
    assert naive.json()["runs"] == 2
    for bad in ("yesterday", "2026-13-01T00:00:00Z", ""):
        response = client.get("/api/v1/stats/", {"since": bad})
        assert response.status_code == 400, bad
        error = response.json()["error"]
        assert "since" in error["fields"], error
        assert "Traceback" not in response.content.decode()


def test_stats_need_a_member(two_tenants: dict[str, Any], viewer_user: Any,
                             tenant: Any, api_client_for: Any) -> None:  # fmt: skip

    assert APIClient().get("/api/v1/stats/").status_code == 401
    viewer = api_client_for(viewer_user, tenant).get("/api/v1/stats/")
    assert viewer.status_code == 200
    assert viewer.json()["runs"] == 2
