"""The harness's verdicts catch what they are there to catch: a run left behind or
ended wrong, a side effect nobody asked for, a stream that differs from the log,
and a slow recovery, each named under "targets missed"."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from runs.models import Agent, Run, Step, ToolCall
from runs.services import run_start
from shop.models import Refund, Replacement, ShopOrder
from soak.checks import (
    PhaseResult,
    check_re_enqueues,
    check_runs,
    check_streams,
    re_enqueues_logged,
    table,
)
from soak.traffic import Follower, RunRecord
from tracing.services import run_event_append

pytestmark = pytest.mark.django_db(transaction=True)


def demo_run(agent: Agent, index: int, *, deny: bool = False) -> tuple[Run, RunRecord]:
    marker = f"soak-test-{index}"
    run = run_start(
        tenant=agent.tenant, agent_slug=agent.slug, input=f"hi [{marker}]",
        started_by=None,
    )  # fmt: skip
    return run, RunRecord(index=index, marker=marker, deny=deny, run_id=str(run.id))


def ended(run: Run, status: str, stop_reason: str = "done") -> None:
    Run.objects.filter(id=run.id).update(status=status, stop_reason=stop_reason)


def replacement_call(run: Run, *, shipped: bool) -> str:
    step = Step.objects.create(run=run, index=1, started_at=timezone.now())
    key = f"key-{run.id}"
    ToolCall.objects.create(
        run=run, step=step, position=0, call_id="call_replace",
        tool_name="create_replacement", idempotency_key=key,
    )  # fmt: skip
    if shipped:
        ship(run, key)
    return key


def ship(run: Run, key: str) -> None:
    Replacement.objects.create(
        order=ShopOrder.objects.get(tenant=run.tenant, order_id="4821"),
        idempotency_key=key,
        reason="dented",
        delivery_date=dt.date.today(),
    )


def test_correct_runs_pass_and_every_wrong_one_is_counted(demo_agent: Any) -> None:
    since = timezone.now() - dt.timedelta(seconds=1)
    good, good_record = demo_run(demo_agent, 0)
    replacement_call(good, shipped=True)
    ended(good, Run.Status.SUCCEEDED)
    denied, denied_record = demo_run(demo_agent, 1, deny=True)
    replacement_call(denied, shipped=False)
    ended(denied, Run.Status.FAILED)
    result = PhaseResult("none")
    everything = [good_record, denied_record]
    check_runs(
        result,
        everything,
        since=since,
        every_run=[r.run_id for r in everything if r.run_id],
    )
    assert (result.runs, result.lost, result.duplicates, result.details) == (
        2,
        0,
        0,
        [],
    )
    assert result.missed() == []

    # A Redis blip's run: approved, shipped, then ended internal_error.
    blip, blip_record = demo_run(demo_agent, 2)
    replacement_call(blip, shipped=True)
    ended(blip, Run.Status.FAILED, "internal_error")
    stuck, stuck_record = demo_run(demo_agent, 3)  # never advanced: queued
    shipped_denied, shipped_denied_record = demo_run(demo_agent, 4, deny=True)
    replacement_call(shipped_denied, shipped=True)
    ended(shipped_denied, Run.Status.FAILED)
    never = RunRecord(index=5, marker="soak-test-5", deny=False)  # API never took it
    # Side effects nobody asked for: a replacement under a key no call holds, and
    # a refund (the demo makes none).
    ship(good, "a-key-of-no-call")
    Refund.objects.create(
        order=ShopOrder.objects.get(tenant=good.tenant, order_id="4821"),
        amount=Decimal("89.00"),
        reason="twice",
    )
    everything += [blip_record, stuck_record, shipped_denied_record, never]
    result = PhaseResult("redis-restart")
    check_runs(
        result,
        everything,
        since=since,
        every_run=[r.run_id for r in everything if r.run_id],
    )
    assert result.runs == 5
    assert result.lost == 4
    assert result.duplicates == 2
    assert "1 runs: approved but failed/internal_error, 1 shipped" in result.details
    assert "1 runs: not terminal (queued)" in result.details
    assert "1 runs: denied but failed/done, 1 shipped" in result.details
    assert "1 runs: never started (the API refused every try)" in result.details
    assert "1 replacements with a key of no call of these runs" in result.details
    assert "1 refunds (the demo makes none)" in result.details
    assert result.missed()[:2] == [
        "redis-restart: 4 runs lost (target 0)",
        "redis-restart: 2 duplicate side effects (target 0)",
    ]


def test_a_stream_that_differs_from_the_log_and_a_slow_recovery_are_missed_targets(
    demo_agent: Any,
) -> None:
    run, _ = demo_run(demo_agent, 0)
    for n in range(3):
        run_event_append(run=run, type="span.started", payload={"n": n})
    stored = list(run.events.order_by("seq").values_list("seq", flat=True))
    assert len(stored) >= 3
    exact = Follower(str(run.id), seqs=list(stored))
    twice = Follower(str(run.id), seqs=[*stored[:2], stored[1], *stored[2:]])
    short = Follower(str(run.id), seqs=stored[:-1])
    result = PhaseResult("daphne-restart", recovery=31.5)
    check_streams(result, [exact, twice, short])
    assert (result.ws_clients, result.ws_mismatches) == (3, 2)
    assert any(f"sent twice {stored[1]}" in d for d in result.details), result.details
    assert any(f"missing {stored[-1]}" in d for d in result.details), result.details
    assert result.missed() == [
        "daphne-restart: 2 of 3 WebSocket clients' seq lists differ from the stored "
        "log (target 0)",
        "daphne-restart: recovery 31.5 s (target <= 20 s)",
    ]
    never = PhaseResult("redis-restart", recovery=math.inf)
    assert never.missed() == ["redis-restart: recovery never (target <= 20 s)"]
    rows = table([result, never, PhaseResult("none")]).splitlines()
    assert rows[0].split("|")[1:-1] == [
        " fault          ", " runs ", " lost ", " duplicates ", " 5xx-for-committed ",
        " WS mismatches ", " recovery s ", " re-enqueued ",
    ]  # fmt: skip
    assert rows[2].split("|")[-4:-2] == ["           2/3 ", "       31.5 "]
    assert rows[3].split("|")[-3] == "      never "
    assert rows[4].split("|")[-3] == "          - "


def test_re_enqueues_are_read_from_the_logs_and_needless_ones_are_a_missed_target(
    demo_agent: Any, tmp_path: Path
) -> None:
    """Recovery's re-enqueues of the phase's runs are counted from the services'
    logs (other runs' lines are not); without a fault, a run re-enqueued more
    than once per hour of its life misses the target (a run of minutes may have
    one); after a fault they are only reported."""
    run, _ = demo_run(demo_agent, 0)
    other, _ = demo_run(demo_agent, 1)
    # Lived two hours: two needless re-enqueues are within the target.
    Run.objects.filter(id=run.id).update(
        created_at=timezone.now() - dt.timedelta(hours=2), finished_at=timezone.now()
    )
    lost = (
        "WARNING runs.services.recovery: run {}: its step was lost; enqueued it again"  # noqa: E501
    )
    (tmp_path / "worker1.log").write_text(
        f"{lost.format(run.id)}\nINFO celery: unrelated\n{lost.format(other.id)}\n"
    )
    (tmp_path / "worker2.log").write_text(f"{lost.format(run.id)}\n")
    logs = sorted(tmp_path.glob("*.log"))
    counts = re_enqueues_logged(logs, [str(run.id)])
    assert counts == {str(run.id): 2}

    result = PhaseResult("none")
    check_re_enqueues(result, counts, [str(run.id)])
    assert (result.re_enqueues, result.runs_over) == (2, 0)
    assert result.details == [
        "2 steps enqueued again by recovery, in 1 runs (at most 2 in one run)"
    ]
    assert result.missed() == []

    (tmp_path / "worker3.log").write_text(f"{lost.format(run.id)}\n")
    counts = re_enqueues_logged(sorted(tmp_path.glob("*.log")), [str(run.id)])
    result = PhaseResult("none")
    check_re_enqueues(result, counts, [str(run.id)])
    assert result.missed() == [
        "none: 1 runs re-enqueued needlessly more than 1 per hour of their life"
    ]
    assert table([result]).splitlines()[2].split("|")[-2] == "           3 "
    # A run of minutes may have one re-enqueue, not two.
    short = PhaseResult("none")
    check_re_enqueues(short, re_enqueues_logged(logs, [str(other.id)]), [str(other.id)])
    assert (short.re_enqueues, short.missed()) == (1, [])
    (tmp_path / "worker4.log").write_text(f"{lost.format(other.id)}\n")
    twice = PhaseResult("none")
    logs = sorted(tmp_path.glob("*.log"))
    check_re_enqueues(twice, re_enqueues_logged(logs, [str(other.id)]), [str(other.id)])
    assert (twice.re_enqueues, twice.runs_over) == (2, 1)
    faulted = PhaseResult("redis-restart")
    check_re_enqueues(faulted, counts, [str(run.id)])
    assert faulted.re_enqueues == 3 and faulted.missed() == []
