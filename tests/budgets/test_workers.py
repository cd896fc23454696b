"""Real Celery workers race for one tenant budget (run on PostgreSQL in CI)."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from controlplane.budget_ledger import window_totals
from controlplane.budget_models import BudgetLedgerEntry
from runs.models import Run, Step
from runs.services import run_start
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
