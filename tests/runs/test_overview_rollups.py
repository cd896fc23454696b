"""The overview reads hourly rollups kept as runs end (runs/rollups.py): its
figures are the same before and after a rollup pass for any window, aligned to
hours or not; an external run that changes after it was counted is counted once,
as it is now; concurrent passes never count a run twice."""

from __future__ import annotations

import datetime as dt
import threading
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from runs.models import Run, RunDurationRollup, RunHourRollup, ToolHourRollup
from runs.services.external import (
    UsageDelta,
    run_external_for_trace,
    run_external_update,
)
from runs.services.rollups import runs_roll_up, runs_roll_up_all
from runs.tasks import runs_roll_up_task
from tests.overview_seed import seed_history


def _overview(client: Any, start: dt.datetime, end: dt.datetime, **extra: str) -> Any:
    params = {"from": start.isoformat(), "to": end.isoformat(), **extra}
    response = client.get("/api/v1/overview/", params)
    assert response.status_code == 200, response.content
    body = response.json()
    body.pop("budgets")  # the ledger's burn, not the runs' rollups
    return body


@pytest.mark.django_db
def test_figures_are_the_same_before_and_after_the_rollup_pass(
    tenant: Any, operator_user: Any, api_client_for: Any
) -> None:
    seeded = seed_history(tenant, operator_user, with_budget=True)
    start = seeded["start"]
    client = api_client_for(operator_user, tenant)
    minutes = dt.timedelta(minutes=1)
    windows = [
        (start, start + dt.timedelta(hours=4), {}),  # whole hours
        (start + 7 * minutes, start + dt.timedelta(hours=1, minutes=10), {}),
        (start - dt.timedelta(hours=30), start + dt.timedelta(hours=5), {}),
        (start + 6 * minutes, start + 8 * minutes, {}),  # inside one hour
        (start - dt.timedelta(days=3), start + dt.timedelta(days=1), {"step": "day"}),
    ]
    before = [_overview(client, a, b, **extra) for a, b, extra in windows]
    assert before[0]["runs"]["total"] == 9
    assert before[1]["runs"]["total"] == 3  # runs 2, 3 and 4 (at 0h07-1h09)

    counted = runs_roll_up_all()

    assert counted == 7  # the ended runs; the running and the waiting stay
    assert Run.objects.filter(rollup_pending=True).count() == 2
    assert RunHourRollup.objects.filter(tenant=tenant).count() == 4
    assert sum(RunDurationRollup.objects.values_list("runs", flat=True)) == 7
    tools = {
        t.tool_name: (t.calls, t.failed, t.cost) for t in ToolHourRollup.objects.all()
    }
    assert tools == {
        "lookup_order": (3, 2, Decimal(0)),
        "send_refund": (1, 1, Decimal("0.75")),
    }
    after = [_overview(client, a, b, **extra) for a, b, extra in windows]
    assert after == before
    # A second pass finds nothing new and changes nothing.
    assert runs_roll_up_all() == 0
    assert [_overview(client, a, b, **extra) for a, b, extra in windows] == before

    # The running run ends: counted once, under its new status.
    running = seeded["runs"][7]
    Run.objects.filter(pk=running.pk).update(
        status=Run.Status.SUCCEEDED,
        finished_at=start + dt.timedelta(hours=2, minutes=30),
    )
    ended = _overview(client, *windows[0][:2])
    assert runs_roll_up() == 1
    assert _overview(client, *windows[0][:2]) == ended
    assert ended["runs"]["totals"]["succeeded"] == 5
    assert ended["runs"]["totals"]["running"] == 0


@pytest.mark.django_db
def test_an_external_run_that_changes_after_it_was_counted_counts_once(
    tenant: Any, operator_user: Any, api_client_for: Any
) -> None:
    began = dt.datetime.now(dt.UTC) - dt.timedelta(hours=3)
    run = run_external_for_trace(
        tenant=tenant, trace_id="ab" * 16, service="payments-bot", started_at=began
    )
    Run.objects.filter(pk=run.pk).update(created_at=began)
    run_external_update(run=run, usage=UsageDelta(steps=1, cost=Decimal("0.5")))
    client = api_client_for(operator_user, tenant)
    window = (began - dt.timedelta(hours=2), began + dt.timedelta(hours=2))
    assert runs_roll_up() == 1

    # Late spans: more cost, a failure, a later end.
    run_external_update(
        run=run,
        usage=UsageDelta(steps=2, cost=Decimal("1.25")),
        failed=True,
        finished_at=began + dt.timedelta(seconds=90),
    )
    pending = _overview(client, *window)
    assert runs_roll_up() == 1
    rolled = _overview(client, *window)
    for body in (pending, rolled):
        assert body["runs"]["total"] == 1
        assert body["runs"]["totals"]["failed"] == 1
        assert body["runs"]["totals"]["succeeded"] == 0
        (agent,) = body["agents"]["by_cost"]
        assert agent["cost"] == pytest.approx(1.75) and agent["runs"] == 1
        assert body["duration"]["count"] == 1
        assert body["duration"]["p50_ms"] == pytest.approx(90_000, rel=0.044)
    assert rolled == pending
    held = RunHourRollup.objects.get(tenant=tenant, status="failed")
    assert held.runs == 1 and held.cost == Decimal("1.75")
    assert RunHourRollup.objects.get(tenant=tenant, status="succeeded").runs == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_passes_count_every_run_once(
    tenant: Any, operator_user: Any
) -> None:
    seed_history(tenant, operator_user)
    seed_history(tenant, operator_user)
    counts: list[int] = []

    def pass_until_done() -> None:
        try:
            while done := runs_roll_up(batch=3):
                counts.append(done)
        finally:
            connection.close()

    threads = [threading.Thread(target=pass_until_done) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sum(counts) == 14
    assert sum(RunHourRollup.objects.values_list("runs", flat=True)) == 14
    assert sum(RunDurationRollup.objects.values_list("runs", flat=True)) == 14


@pytest.mark.django_db
def test_beat_rolls_up_ended_runs_every_interval(
    tenant: Any, operator_user: Any
) -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["runs-roll-up"]
    assert entry["task"] == "runs.tasks.runs_roll_up_task"
    assert entry["schedule"] == settings.RUNS_ROLLUP_INTERVAL_SECONDS == 30.0
    seed_history(tenant, operator_user)
    assert runs_roll_up_task() == 7
    assert not Run.objects.filter(rollup_pending=True, status__in=Run.TERMINAL).exists()
