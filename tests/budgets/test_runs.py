"""Budgets around real run steps (driven in this process): refusals end the run
before the call, reservations settle with recorded usage, slots, recovery."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from budgets.models import BudgetLedgerEntry
from budgets.selectors import window_totals
from runs.models import Run, Step, ToolCall
from runs.services import recover_stalled_runs, run_advance, run_cancel, run_start
from runs.services.admission import budget_update_and_admit as budget_update
from tests.budgets.conftest import counter_sums
from tracing.models import RunEvent

LOOKUPS = [
    {"tool_calls": [{"id": f"c{i}", "name": "paid_lookup", "arguments": {"q": "x"}}],
     "usage": {"input_tokens": 10, "output_tokens": 5}}
    for i in range(3)
] + [{"text": "done", "usage": {"input_tokens": 10, "output_tokens": 5}}]  # fmt: skip
# Each model call above costs 10 * 0.001 + 5 * 0.002 = $0.02; each lookup $0.50.
ANSWER = [{"text": "done", "usage": {"input_tokens": 10, "output_tokens": 5}}]

pytestmark = pytest.mark.usefixtures("small_reservations")


def start(tenant, **kwargs):
    return run_start(
        tenant=tenant, agent_slug="scripted", input="go", started_by=None, **kwargs
    )


def events(run, type):
    return list(RunEvent.objects.filter(run=run, type=type).order_by("seq"))


def step_once(run):
    run.refresh_from_db()
    return run_advance(run_id=str(run.id), step_token=str(run.step_token), owner="test")


def test_tenant_limit_refuses_the_first_model_call_before_it_is_made(
    tenant, make_budget, scripted_agent, scripted_price, drive_run
):
    make_budget(tenant, period_limits={"day": {"cost": "0.01"}})
    scripted_agent(ANSWER, [])
    run = drive_run(start(tenant))
    assert run.status == Run.Status.BUDGET_EXHAUSTED
    assert run.stop_reason == "tenant_cost_per_day"
    assert "0.01" in run.stop_detail
    assert Step.objects.filter(run=run).count() == 0  # the model was never called
    assert run.steps == 0 and run.input_tokens == 0
    assert not BudgetLedgerEntry.objects.filter(kind="model_call").exists()
    [exhausted] = events(run, "budget.exhausted")
    assert exhausted.payload["dimension"] == "tenant_cost_per_day"
    assert events(run, "budget.reserved") == []
    assert window_totals(tenant.pk, "calendar", "day", timezone.now())["cost"] == 0


def test_each_call_is_reserved_then_settled_with_its_recorded_usage(
    tenant, make_budget, scripted_agent, scripted_price, paid_tool, drive_run
):
    make_budget(tenant, period_limits={"day": {"cost": "10"}})
    scripted_agent(LOOKUPS, ["paid_lookup"])
    run = drive_run(start(tenant))
    assert run.status == Run.Status.UNVERIFIED, (run.stop_reason, run.stop_detail)
    assert len(paid_tool) == 3
    assert run.cost == Decimal("0.08") + Decimal("1.50")
    entries = BudgetLedgerEntry.objects.filter(run_id=run.id)
    assert entries.filter(kind="model_call", status="settled").count() == 4
    assert entries.filter(kind="tool_call", status="settled").count() == 3
    assert not entries.filter(status="reserved").exists()
    day = counter_sums("day", tenant=tenant)
    assert day.used_cost == Decimal("1.58")
    assert day.reserved_cost == 0
    assert (day.used_input_tokens, day.used_output_tokens) == (40, 20)
    assert day.used_runs == 1
    reserved = events(run, "budget.reserved")
    settled = events(run, "budget.settled")
    assert [e.payload["kind"] for e in reserved] == ["model_call", "tool_call"] * 3 + [
        "model_call"
    ]
    assert len(settled) == 7
    assert Decimal(settled[0].payload["cost"]) == Decimal("0.02")
    assert settled[0].payload["input_tokens"] == 10
    assert settled[1].payload == {
        "kind": "tool_call",
        "entry": reserved[1].payload["entry"],
        "input_tokens": 0,
        "output_tokens": 0,
        "cost": "0.5",
        "runs": 0,
    }


def test_tool_call_over_the_limit_is_refused_and_its_handler_never_runs(
    tenant, make_budget, scripted_agent, scripted_price, paid_tool, drive_run
):
    make_budget(tenant, period_limits={"day": {"cost": "0.51"}})
    scripted_agent(LOOKUPS, ["paid_lookup"])
    run = drive_run(start(tenant))
    assert run.status == Run.Status.BUDGET_EXHAUSTED
    assert run.stop_reason == "tenant_cost_per_day"
    assert paid_tool == []  # the handler never ran
    call = ToolCall.objects.get(run=run)
    assert call.status == ToolCall.Status.CANCELLED and call.result is None
    assert not BudgetLedgerEntry.objects.filter(kind="tool_call").exists()
    assert events(run, "budget.exhausted")[0].payload["tool"] == "paid_lookup"
    day = counter_sums("day")
    assert (day.used_cost, day.reserved_cost) == (Decimal("0.02"), 0)


def test_lowering_the_ceiling_mid_run_stops_it_at_the_next_reservation(
    tenant, make_budget, scripted_agent, scripted_price, paid_tool, admin_user
):
    make_budget(tenant)
    scripted_agent(LOOKUPS, ["paid_lookup"])
    run = start(tenant)
    assert step_once(run) == "continued"
    budget_update(
        tenant=tenant, actor=admin_user, data={"limits": {"run": {"max_steps": 1}}}
    )
    assert step_once(run) == "finished"
    run.refresh_from_db()
    assert (run.status, run.stop_reason, run.steps) == (
        "budget_exhausted",
        "max_steps",
        1,
    )
    assert len(paid_tool) == 1


def test_lowering_a_period_limit_mid_run_stops_it_at_the_next_reservation(
    tenant, make_budget, scripted_agent, scripted_price, paid_tool, admin_user
):
    make_budget(tenant)
    scripted_agent(LOOKUPS, ["paid_lookup"])
    run = start(tenant)
    assert step_once(run) == "continued"  # spent 0.02 + 0.50
    budget_update(
        tenant=tenant, actor=admin_user, data={"limits": {"day": {"cost": "0.53"}}}
    )
    assert step_once(run) == "finished"
    run.refresh_from_db()
    assert run.stop_reason == "tenant_cost_per_day"
    assert Step.objects.filter(run=run).count() == 1
    assert len(paid_tool) == 1


def test_a_request_above_the_ceiling_is_refused_and_an_agent_default_is_lowered(
    tenant, make_budget, scripted_agent
):
    from runs.services import RunInputError

    make_budget(tenant, run_caps={"max_steps": 5, "max_cost": "2"})
    scripted_agent(ANSWER, [], default_limits={"max_steps": 20})
    with pytest.raises(RunInputError) as refused:
        start(tenant, limits={"max_steps": 6})
    assert refused.value.field == "limits" and "max_steps" in str(refused.value)
    assert not Run.objects.exists()
    run = start(tenant, limits={"max_steps": 3})
    assert run.limits["max_steps"] == 3 and run.limits["max_cost"] == "2"
    assert start(tenant).limits["max_steps"] == 5


def test_crash_between_reserve_and_settle_is_released_by_recovery(
    tenant, make_budget, scripted_agent, scripted_price, paid_tool, monkeypatch
):
    import runs.services.advance as advance

    class Killed(BaseException):
        pass

    def die(name):
        if name == "before_tool_execute":
            raise Killed

    make_budget(tenant, period_limits={"day": {"cost": "10"}})
    scripted_agent(LOOKUPS, ["paid_lookup"])
    run = start(tenant)
    monkeypatch.setattr(advance, "failpoint", die)
    with pytest.raises(Killed):
        step_once(run)
    open_entry = BudgetLedgerEntry.objects.get(kind="tool_call")
    assert open_entry.status == "reserved"
    assert counter_sums("day").reserved_cost == Decimal("0.5")
    long_ago = timezone.now() - dt.timedelta(hours=1)
    Run.objects.filter(id=run.id).update(updated_at=long_ago, lease_expires_at=long_ago)
    assert recover_stalled_runs() == 1
    open_entry.refresh_from_db()
    assert open_entry.status == "released"
    day = counter_sums("day")
    assert (day.reserved_cost, day.used_cost) == (0, Decimal("0.02"))
    assert paid_tool == []


def test_runs_beyond_the_concurrency_limit_wait_and_start_oldest_first(
    tenant, make_budget, scripted_agent, drive_run
):
    make_budget(tenant, max_concurrent_runs=1)
    scripted_agent(ANSWER, [])
    first, second, third = start(tenant), start(tenant), start(tenant)
    assert first.step_token is not None
    for waiting in (second, third):
        waiting.refresh_from_db()
        assert (waiting.status, waiting.step_token) == ("queued", None)
    assert recover_stalled_runs() == 0  # a waiting run is not a lost one
    drive_run(first)
    second.refresh_from_db()
    third.refresh_from_db()
    assert second.step_token is not None and third.step_token is None
    run_cancel(run=second, actor=None)  # a cancel frees the slot at once
    third.refresh_from_db()
    assert third.step_token is not None
    assert drive_run(third).status == Run.Status.UNVERIFIED


def test_cancelling_a_waiting_run_starts_nothing_and_holds_nothing(
    tenant, make_budget, scripted_agent
):
    make_budget(tenant, max_concurrent_runs=1)
    scripted_agent(ANSWER, [])
    first, second = start(tenant), start(tenant)
    cancelled = run_cancel(run=second, actor=None)
    assert (cancelled.status, cancelled.step_token) == ("cancelled", None)
    first.refresh_from_db()
    assert first.status == "queued" and first.step_token is not None


def test_raising_the_concurrency_limit_starts_waiting_runs(
    tenant, make_budget, scripted_agent, admin_user
):
    make_budget(tenant, max_concurrent_runs=1)
    scripted_agent(ANSWER, [])
    start(tenant)
    waiting = [start(tenant), start(tenant)]
    budget_update(
        tenant=tenant, actor=admin_user, data={"limits": {"max_concurrent_runs": 3}}
    )
    for run in waiting:
        run.refresh_from_db()
        assert run.step_token is not None


def test_runs_per_day_limit_ends_a_new_run_before_any_step(
    tenant, make_budget, scripted_agent
):
    make_budget(tenant, period_limits={"day": {"runs": 1}})
    scripted_agent(ANSWER, [])
    start(tenant)
    refused = start(tenant)
    assert refused.status == Run.Status.BUDGET_EXHAUSTED
    assert refused.stop_reason == "tenant_runs_per_day"
    assert refused.step_token is None
    assert events(refused, "budget.exhausted")[0].payload["kind"] == "run"


def test_unknown_price_refuses_a_cost_capped_run_unless_the_tenant_allows_it(
    tenant, make_budget, scripted_agent, drive_run
):
    budget = make_budget(tenant, period_limits={"day": {"cost": "5"}})
    scripted_agent(ANSWER, [])
    run = drive_run(start(tenant))
    assert (run.status, run.stop_reason) == ("budget_exhausted", "unknown_price")
    assert Step.objects.filter(run=run).count() == 0
    budget.allow_unknown_price = True
    budget.save()
    run = drive_run(start(tenant))
    assert run.status == Run.Status.UNVERIFIED
    day = counter_sums("day")
    assert (day.used_input_tokens, day.used_cost) == (10, 0)  # tokens still count


def test_unknown_price_is_fine_when_nothing_caps_the_cost(
    tenant, scripted_agent, drive_run
):
    scripted_agent(ANSWER, [])
    assert drive_run(start(tenant)).status == Run.Status.UNVERIFIED
    assert not BudgetLedgerEntry.objects.exists()  # no budget, no ledger


def test_run_api_shows_usage_against_caps(
    tenant, scripted_agent, scripted_price, drive_run, api_client_for, viewer_user
):
    scripted_agent(ANSWER, [])
    run = drive_run(start(tenant, limits={"max_cost": "1.5"}))
    body = api_client_for(viewer_user, tenant).get(f"/api/v1/runs/{run.id}/").json()
    assert body["budget"]["steps"] == {"used": 1, "cap": 50}
    assert body["budget"]["cost"] == {"used": "0.020000", "cap": "1.5"}
    assert body["budget"]["input_tokens"] == {"used": 10, "cap": None}


def test_a_model_that_never_stops_ends_at_the_tenant_step_ceiling_with_an_event(
    tenant, make_budget, scripted_agent, scripted_price, paid_tool, drive_run
):
    """Scenario 14: 10 turns allowed; the 11th model call is never made."""
    endless = [
        {"tool_calls": [{"id": f"c{i}", "name": "paid_lookup",
                         "arguments": {"q": str(i)}}],
         "usage": {"input_tokens": 10, "output_tokens": 5}}
        for i in range(30)
    ]  # fmt: skip
    make_budget(tenant, run_caps={"max_steps": 10})
    scripted_agent(endless, ["paid_lookup"])
    run = drive_run(start(tenant))
    assert (run.status, run.stop_reason) == ("budget_exhausted", "max_steps")
    assert Step.objects.filter(run=run).count() == 10
    assert len(paid_tool) == 10
    [exhausted] = events(run, "budget.exhausted")
    assert exhausted.payload["dimension"] == "max_steps"
    assert exhausted.payload["kind"] == "run_cap"
    assert not BudgetLedgerEntry.objects.filter(status="reserved").exists()
