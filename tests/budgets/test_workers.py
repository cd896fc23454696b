"""Real Celery workers race for one tenant budget (run on PostgreSQL in CI)."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest
from budgets.models import BudgetGrant, BudgetLedgerEntry
from budgets.selectors import window_totals
from runs.models import Run, Step
from runs.services import run_start
from runs.services.decide import approval_decide
from tests.conftest import start_worker

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# No usage reported: each call is billed its reservation (estimate in, 8 out), so
# exactly 7 calls fit 56 output tokens.
SCRIPT = [{"text": "done"}]


def test_twenty_runs_racing_for_a_budget_that_fits_seven(
    tenant, make_budget, scripted_agent, tmp_path
):
    make_budget(tenant, period_limits={"day": {"output_tokens": 56}})
    scripted_agent(SCRIPT, [])
    worker = start_worker(
        tmp_path, concurrency=4, extra_env={"RUN_RESERVE_OUTPUT_TOKENS": "8"}
    )
    try:
        runs = [
            run_start(tenant=tenant, agent_slug="scripted", input="go", started_by=None)
            for _ in range(20)
        ]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if not Run.objects.exclude(status__in=Run.TERMINAL).exists():
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"runs did not end:\n{worker.output()[-3000:]}")
    finally:
        worker.stop()
    ended = {run.id: run for run in Run.objects.filter(id__in=[r.id for r in runs])}
    spent = [run for run in ended.values() if run.status == Run.Status.UNVERIFIED]
    refused = [run for run in ended.values() if run.status != Run.Status.UNVERIFIED]
    assert len(spent) == 7
    assert {(r.status, r.stop_reason) for r in refused} == {
        ("budget_exhausted", "tenant_output_tokens_per_day")
    }
    assert Step.objects.filter(run__in=refused).count() == 0  # never called
    totals = window_totals(tenant.pk, "calendar", "day", timezone.now())
    assert totals["output_tokens"] == 56  # never above the limit, by any amount
    assert sum(run.output_tokens for run in spent) == 56
    assert not BudgetLedgerEntry.objects.filter(status="reserved").exists()


def wait_until(check, worker, what, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out: {what}\n{worker.output()[-3000:]}")


def settled(run_ids):
    """Every run ended or is waiting for a decision (holding no worker)."""
    busy = Run.objects.filter(id__in=run_ids).exclude(
        status__in=[*Run.TERMINAL, Run.Status.WAITING_APPROVAL]
    )
    return not busy.exists()


def test_ask_mode_on_a_worker_pauses_then_approve_resumes_and_deny_ends(
    tenant, make_budget, scripted_agent, operator_user, api_client_for, tmp_path
):
    make_budget(
        tenant,
        period_limits={"day": {"output_tokens": 8}},
        on_exhausted="ask",
        extend_by={"output_tokens": 8},
    )
    scripted_agent(SCRIPT, [])
    client = api_client_for(operator_user, tenant)
    worker = start_worker(
        tmp_path, concurrency=2, extra_env={"RUN_RESERVE_OUTPUT_TOKENS": "8"}
    )
    try:
        first = run_start(tenant=tenant, agent_slug="scripted", input="go",
                          started_by=operator_user)  # fmt: skip
        wait_until(lambda: Run.objects.get(id=first.id).is_terminal, worker, "first")
        second = run_start(tenant=tenant, agent_slug="scripted", input="go",
                           started_by=operator_user)  # fmt: skip
        wait_until(
            lambda: Run.objects.get(id=second.id).status == "waiting_approval",
            worker, "second to wait",
        )  # fmt: skip
        waiting = Run.objects.get(id=second.id)
        assert (waiting.step_token, waiting.lease_owner) == (None, "")  # no worker
        assert not Step.objects.filter(run=waiting).exists()
        approval = ApprovalRequest.objects.get(run=second, status="pending")
        assert approval.extension["amount"] == "8"
        response = client.post(
            f"/api/v1/approvals/{approval.id}/decide/",
            {"decision": "approve"},
            format="json",
        )
        assert response.status_code == 200, response.json()
        wait_until(lambda: Run.objects.get(id=second.id).is_terminal, worker, "second")
        third = run_start(tenant=tenant, agent_slug="scripted", input="go",
                          started_by=operator_user)  # fmt: skip
        wait_until(
            lambda: Run.objects.get(id=third.id).status == "waiting_approval",
            worker, "third to wait",
        )  # fmt: skip
        denial = ApprovalRequest.objects.get(run=third, status="pending")
        response = client.post(
            f"/api/v1/approvals/{denial.id}/decide/",
            {"decision": "deny", "reason": "over budget"},
            format="json",
        )
        assert response.status_code == 200, response.json()
    finally:
        worker.stop()
    first, second, third = (Run.objects.get(id=r.id) for r in (first, second, third))
    assert (first.status, first.output_tokens) == ("unverified", 8)
    assert (second.status, second.output_tokens) == ("unverified", 8)
    assert (third.status, third.stop_reason) == (
        "budget_exhausted",
        "tenant_output_tokens_per_day",
    )
    assert not Step.objects.filter(run=third).exists()
    grant = BudgetGrant.objects.get(run_id=second.id)
    assert (grant.amount, grant.used, grant.reserved) == (8, 8, 0)
    pool = window_totals(tenant.pk, "calendar", "day", timezone.now())
    assert pool["output_tokens"] == 8  # the tenant's limit, exactly
    assert not BudgetLedgerEntry.objects.filter(status="reserved").exists()


def test_twenty_runs_racing_in_ask_mode_spend_no_more_than_the_granted_extensions(
    tenant, make_budget, scripted_agent, operator_user, tmp_path
):
    make_budget(
        tenant,
        period_limits={"day": {"output_tokens": 56}},
        on_exhausted="ask",
        extend_by={"output_tokens": 8},
    )
    scripted_agent(SCRIPT, [])
    worker = start_worker(
        tmp_path, concurrency=4, extra_env={"RUN_RESERVE_OUTPUT_TOKENS": "8"}
    )
    try:
        runs = [
            run_start(tenant=tenant, agent_slug="scripted", input="go", started_by=None)
            for _ in range(20)
        ]
        ids = [run.id for run in runs]
        wait_until(lambda: settled(ids), worker, "the runs to end or wait")
        waiting = list(
            ApprovalRequest.objects.filter(run_id__in=ids, status="pending").order_by(
                "requested_at"
            )
        )
        assert len(waiting) == 13  # 7 fit the tenant's limit; the rest ask
        assert Run.objects.filter(id__in=ids, status="unverified").count() == 7
        for index, request in enumerate(waiting):
            approval_decide(
                request=request,
                decided_by=operator_user,
                approve=index < 3,
                reason="" if index < 3 else "no more today",
            )
        wait_until(
            lambda: not Run.objects.filter(id__in=ids).exclude(
                status__in=Run.TERMINAL
            ).exists(),
            worker, "every run to end",
        )  # fmt: skip
    finally:
        worker.stop()
    ended = list(Run.objects.filter(id__in=ids))
    spent = [run for run in ended if run.status == Run.Status.UNVERIFIED]
    refused = [run for run in ended if run.status != Run.Status.UNVERIFIED]
    assert len(spent) == 10  # 7 within the limit, 3 on their own extension
    assert {(r.status, r.stop_reason) for r in refused} == {
        ("budget_exhausted", "tenant_output_tokens_per_day")
    }
    assert Step.objects.filter(run__in=refused).count() == 0  # never called
    pool = window_totals(tenant.pk, "calendar", "day", timezone.now())
    assert pool["output_tokens"] == 56  # the tenant's limit, never crossed
    grants = list(BudgetGrant.objects.all())
    assert len(grants) == 3
    assert all((g.amount, g.used, g.reserved) == (8, 8, 0) for g in grants)
    # Spent in all: the limit plus the granted extensions, by no amount more.
    assert sum(run.output_tokens for run in spent) == 56 + 3 * 8
    assert not BudgetLedgerEntry.objects.filter(status="reserved").exists()
