"""Ask mode: a refused reservation asks "extend <dimension> by X" instead of ending
the run (steps driven in this process; tests/budgets/test_workers.py has workers)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest
from budgets.models import BudgetGrant, BudgetLedgerEntry
from budgets.selectors import window_totals
from controlplane.models import AuditEvent
from runs.models import Run, Step, ToolCall
from runs.services import run_start
from runs.services.decide import approvals_expire
from tracing.models import RunEvent

ANSWER = [{"text": "done", "usage": {"input_tokens": 10, "output_tokens": 5}}]
LOOKUPS = [
    {"tool_calls": [{"id": f"c{i}", "name": "paid_lookup", "arguments": {"q": "x"}}],
     "usage": {"input_tokens": 10, "output_tokens": 5}}
    for i in range(3)
] + ANSWER  # fmt: skip
# Each model call costs $0.02 (10 in, 5 out); each lookup $0.50.

pytestmark = pytest.mark.usefixtures("small_reservations", "scripted_price")


def start(tenant):
    return run_start(tenant=tenant, agent_slug="scripted", input="go", started_by=None)


def pending(run):
    return ApprovalRequest.objects.get(run=run, status="pending")


def decide(client, approval, decision, **body):
    url = f"/api/v1/approvals/{approval.id}/decide/"
    return client.post(url, {"decision": decision, **body}, format="json")


def event_types(run):
    return list(
        RunEvent.objects.filter(run=run)
        .exclude(type__startswith="span.")
        .order_by("seq")
        .values_list("type", flat=True)
    )


def test_ask_mode_pauses_the_run_instead_of_ending_it(
    tenant, make_budget, scripted_agent, drive_run, operator_user
):
    make_budget(tenant, period_limits={"day": {"cost": "0.01"}}, on_exhausted="ask")
    scripted_agent(ANSWER, [])
    run = drive_run(start(tenant))
    assert run.status == Run.Status.WAITING_APPROVAL
    assert (run.step_token, run.lease_owner, run.stop_reason) == (None, "", "")
    approval = pending(run)
    assert approval.kind == "budget_extension" and approval.tool_call is None
    extension = approval.extension
    assert extension["scope"] == "period" and extension["period"] == "day"
    assert extension["dimension"] == "tenant_cost_per_day"
    assert extension["stop_reason"] == "tenant_cost_per_day"
    # The step is the limit again, but a grant must hold the whole reservation.
    wanted = Decimal(extension["wanted"])
    assert wanted > Decimal("0.01")
    assert Decimal(extension["amount"]) == wanted
    assert approval.approver_roles == ["admin", "operator"]
    assert Step.objects.filter(run=run).count() == 0  # the model was never called
    assert not BudgetLedgerEntry.objects.filter(kind="model_call").exists()
    assert "budget.exhausted" in event_types(run)
    assert "approval.requested" in event_types(run)
    assert AuditEvent.objects.filter(action="approval.request").count() == 1


def test_approve_resumes_at_the_refused_reservation_and_spends_at_most_the_extension(
    tenant, make_budget, scripted_agent, drive_run, operator_user, api_client_for
):
    make_budget(tenant, period_limits={"day": {"cost": "0.01"}}, on_exhausted="ask")
    scripted_agent(ANSWER, [])
    run = drive_run(start(tenant))
    approval = pending(run)
    amount = Decimal(approval.extension["amount"])
    response = decide(api_client_for(operator_user, tenant), approval, "approve")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["kind"] == "budget_extension" and body["tool_call_id"] is None
    assert body["summary"] == f"extend tenant_cost_per_day by {amount}"
    [grant] = BudgetGrant.objects.filter(run_id=run.id)
    assert (grant.period, grant.dimension, grant.amount) == ("day", "cost", amount)
    [audit] = AuditEvent.objects.filter(action="budget.extend")
    assert audit.actor == operator_user and audit.object_id == str(run.id)
    assert Decimal(audit.after["amount"]) == amount
    assert audit.after["dimension"] == "tenant_cost_per_day"
    run = drive_run(run)
    assert run.status == Run.Status.UNVERIFIED, (run.stop_reason, run.stop_detail)
    assert run.cost == Decimal("0.02")
    grant.refresh_from_db()
    assert (grant.used, grant.reserved) == (Decimal("0.02"), 0)
    [entry] = BudgetLedgerEntry.objects.filter(kind="model_call")
    assert entry.status == "settled" and entry.funding[0]["grant"] == grant.pk
    # The tenant's own limit was never crossed; the rest was the run's grant.
    day = window_totals(tenant.pk, "calendar", "day", timezone.now())
    assert day["cost"] <= Decimal("0.01")
    assert "budget.extended" in event_types(run)
    body = api_client_for(operator_user, tenant).get("/api/v1/budget/").json()
    assert Decimal(body["usage"]["day"]["cost"]) == Decimal("0.02")  # grants count


def test_deny_ends_the_run_budget_exhausted_with_the_dimension(
    tenant, make_budget, scripted_agent, drive_run, operator_user, api_client_for
):
    make_budget(tenant, period_limits={"day": {"cost": "0.01"}}, on_exhausted="ask")
    scripted_agent(ANSWER, [])
    run = drive_run(start(tenant))
    response = decide(
        api_client_for(operator_user, tenant), pending(run), "deny", reason="no"
    )
    assert response.status_code == 200, response.json()
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("budget_exhausted", "tenant_cost_per_day")
    assert "was denied: no" in run.stop_detail
    assert run.step_token is None and run.finished_at is not None
    assert not BudgetGrant.objects.exists()
    assert not BudgetLedgerEntry.objects.filter(status="reserved").exists()
    assert Step.objects.filter(run=run).count() == 0
    assert not AuditEvent.objects.filter(action="budget.extend").exists()
    assert AuditEvent.objects.get(action="approval.deny").actor == operator_user


def test_expiry_ends_the_run_as_a_deny_would(
    tenant, make_budget, scripted_agent, drive_run, operator_user
):
    make_budget(tenant, period_limits={"day": {"cost": "0.01"}}, on_exhausted="ask")
    scripted_agent(ANSWER, [])
    run = drive_run(start(tenant))
    ApprovalRequest.objects.filter(run=run).update(
        expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert approvals_expire() == 1
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("budget_exhausted", "tenant_cost_per_day")
    assert "was expired" in run.stop_detail
    assert ApprovalRequest.objects.get(run=run).status == "expired"
    assert not BudgetGrant.objects.exists()


def test_a_run_cap_is_raised_by_the_step_and_the_run_asks_again_when_it_is_spent(
    tenant, make_budget, scripted_agent, paid_tool, drive_run, operator_user,
    api_client_for,
):  # fmt: skip
    make_budget(
        tenant, run_caps={"max_steps": 2}, on_exhausted="ask",
        extend_by={"max_steps": 1},
    )  # fmt: skip
    scripted_agent(LOOKUPS, ["paid_lookup"])
    client = api_client_for(operator_user, tenant)
    run = drive_run(start(tenant))
    assert run.status == Run.Status.WAITING_APPROVAL and run.steps == 2
    first = pending(run)
    assert first.extension["scope"] == "run_cap"
    assert (first.extension["name"], first.extension["amount"]) == ("max_steps", "1")
    assert first.extension["limit"] == "2" and first.extension["used"] == "2"
    assert decide(client, first, "approve").status_code == 200
    run = drive_run(run)
    assert run.status == Run.Status.WAITING_APPROVAL and run.steps == 3
    assert pending(run).extension["limit"] == "3"
    assert decide(client, pending(run), "approve").status_code == 200
    run = drive_run(run)
    assert run.status == Run.Status.UNVERIFIED, (run.stop_reason, run.stop_detail)
    assert run.limit_extensions == {"max_steps": "2"}
    assert Step.objects.filter(run=run).count() == 4
    assert len(paid_tool) == 3  # every lookup ran exactly once
    body = client.get(f"/api/v1/runs/{run.id}/").json()
    assert body["budget"]["steps"] == {"used": 4, "cap": 4}
    assert AuditEvent.objects.filter(action="budget.extend").count() == 2


def test_a_refused_tool_reservation_is_retried_after_approval_never_skipped(
    tenant, make_budget, scripted_agent, paid_tool, drive_run, operator_user,
    api_client_for,
):  # fmt: skip
    make_budget(tenant, period_limits={"day": {"cost": "0.51"}}, on_exhausted="ask")
    scripted_agent(LOOKUPS, ["paid_lookup"])
    client = api_client_for(operator_user, tenant)
    run = drive_run(start(tenant))
    assert run.status == Run.Status.WAITING_APPROVAL
    assert paid_tool == []  # refused before its handler
    call = ToolCall.objects.get(run=run)
    assert call.status == ToolCall.Status.PENDING and call.result is None
    first = pending(run)
    # The step (the limit again, 0.51) is more than the call needs (0.50).
    assert first.extension["amount"] == "0.51"
    assert decide(client, first, "approve").status_code == 200
    run = drive_run(run)
    assert len(paid_tool) == 1  # the refused call ran, once
    call.refresh_from_db()
    assert call.status == ToolCall.Status.SUCCEEDED
    # The second lookup finds the grant spent (0.50 of 0.51): it asks again.
    assert run.status == Run.Status.WAITING_APPROVAL
    second = pending(run)
    assert decide(client, second, "deny", reason="enough").status_code == 200
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("budget_exhausted", "tenant_cost_per_day")
    assert len(paid_tool) == 1
    grant = BudgetGrant.objects.get(run_id=run.id)
    assert (grant.amount, grant.used, grant.reserved) == (
        Decimal("0.51"),
        Decimal("0.50"),
        0,
    )
    day = window_totals(tenant.pk, "calendar", "day", timezone.now())
    assert day["cost"] <= Decimal("0.51")  # the tenant's own allowance
    assert not BudgetLedgerEntry.objects.filter(status="reserved").exists()


@pytest.mark.parametrize(
    ("user", "body", "status", "field"),
    [
        ("viewer_user", {"decision": "approve"}, 403, None),
        ("operator_user", {"decision": "approve", "scope": "run"}, 400, "scope"),
        ("operator_user", {"decision": "approve", "args": {"q": 1}}, 400, "args"),
        ("operator_user", {"decision": "extend"}, 400, "decision"),
        ("operator_user", {"decision": "approve", "amount": 5}, 400, "amount"),
    ],
)
def test_a_refused_or_bad_decision_changes_nothing(
    tenant, make_budget, scripted_agent, drive_run, operator_user, viewer_user,
    api_client_for, request, user, body, status, field,
):  # fmt: skip
    make_budget(tenant, period_limits={"day": {"cost": "0.01"}}, on_exhausted="ask")
    scripted_agent(ANSWER, [])
    run = drive_run(start(tenant))
    approval = pending(run)
    client = api_client_for(request.getfixturevalue(user), tenant)
    response = client.post(
        f"/api/v1/approvals/{approval.id}/decide/", body, format="json"
    )
    assert response.status_code == status, response.json()
    if field:
        assert field in response.json()["error"]["fields"]
    approval.refresh_from_db()
    run.refresh_from_db()
    assert approval.status == "pending" and not approval.decisions.exists()
    assert run.status == Run.Status.WAITING_APPROVAL and run.limit_extensions == {}
    assert not BudgetGrant.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="budget.extend").exists()
    decided = AuditEvent.objects.filter(
        action__in=["approval.approve", "approval.deny"]
    )
    assert not decided.exists()


def test_a_second_decision_gets_409_and_grants_nothing_more(
    tenant, make_budget, scripted_agent, drive_run, operator_user, admin_user,
    api_client_for,
):  # fmt: skip
    make_budget(tenant, period_limits={"day": {"cost": "0.01"}}, on_exhausted="ask")
    scripted_agent(ANSWER, [])
    run = drive_run(start(tenant))
    approval = pending(run)
    assert (
        decide(api_client_for(operator_user, tenant), approval, "approve").status_code
        == 200
    )
    again = decide(api_client_for(admin_user, tenant), approval, "approve")
    assert again.status_code == 409
    assert again.json()["error"]["approval"]["decided_by"] == operator_user.username
    assert BudgetGrant.objects.get().amount == Decimal(approval.extension["amount"])
    assert AuditEvent.objects.filter(action="budget.extend").count() == 1


def test_without_anyone_who_may_decide_the_run_ends_as_in_stop_mode(
    tenant, make_budget, scripted_agent, drive_run, viewer_user
):
    make_budget(tenant, period_limits={"day": {"cost": "0.01"}}, on_exhausted="ask")
    scripted_agent(ANSWER, [])
    run = drive_run(start(tenant))
    assert (run.status, run.stop_reason) == ("budget_exhausted", "tenant_cost_per_day")
    assert not ApprovalRequest.objects.exists()


def test_cancelling_a_run_waiting_for_an_extension_cancels_the_request(
    tenant, make_budget, scripted_agent, drive_run, operator_user
):
    from runs.services import run_cancel

    make_budget(tenant, period_limits={"day": {"cost": "0.01"}}, on_exhausted="ask")
    scripted_agent(ANSWER, [])
    run = drive_run(start(tenant))
    cancelled = run_cancel(run=run, actor=operator_user)
    assert cancelled.status == Run.Status.CANCELLED
    assert ApprovalRequest.objects.get(run=run).status == "cancelled"
    assert not BudgetLedgerEntry.objects.filter(status="reserved").exists()
