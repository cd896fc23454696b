"""The ledger: reserve against period limits, settle, release, windows, races."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from decimal import Decimal

import pytest
from django.db import close_old_connections, connection

from budgets.ledger import (
    budget_release,
    budget_release_for_run,
    budget_reserve,
    budget_settle,
)
from budgets.models import BudgetCounter, BudgetLedgerEntry
from budgets.periods import Amounts, BudgetRefusal
from budgets.selectors import window_totals
from tests.budgets.conftest import counter_sums

NOON = dt.datetime(2026, 3, 14, 12, 30, tzinfo=dt.UTC)


def day_totals(tenant, mode="calendar", now=NOON):
    return window_totals(tenant.pk, mode, "day", now)


def test_reservation_counts_against_the_day_and_the_month(tenant, make_budget):
    budget = make_budget(tenant, period_limits={"day": {"cost": "1.00"}})
    entry = budget_reserve(
        budget=budget,
        run_id=uuid.uuid4(),
        kind="model_call",
        amounts=Amounts(input_tokens=10, output_tokens=5, cost=Decimal("0.40")),
        now=NOON,
    )
    assert isinstance(entry, BudgetLedgerEntry)
    assert entry.status == "reserved"
    for period in ("day", "month"):
        counter = counter_sums(period, tenant=tenant)
        assert counter.reserved_cost == Decimal("0.40")
        assert counter.reserved_input_tokens == 10
        assert counter.reserved_output_tokens == 5
        assert counter.used_cost == 0


def test_reservation_over_the_limit_is_refused_and_changes_nothing(tenant, make_budget):
    budget = make_budget(tenant, period_limits={"day": {"cost": "1.00"}})
    first = budget_reserve(
        budget=budget,
        run_id=uuid.uuid4(),
        kind="model_call",
        amounts=Amounts(cost=Decimal("0.70")),
        now=NOON,
    )
    assert isinstance(first, BudgetLedgerEntry)
    refused = budget_reserve(
        budget=budget,
        run_id=uuid.uuid4(),
        kind="model_call",
        amounts=Amounts(cost=Decimal("0.31")),
        now=NOON,
    )
    assert isinstance(refused, BudgetRefusal)
    assert refused.dimension == "tenant_cost_per_day"
    assert "1.00" in refused.detail
    assert BudgetLedgerEntry.objects.count() == 1  # no row for the refusal
    assert day_totals(tenant)["cost"] == Decimal("0.70")
    month = counter_sums("month", tenant=tenant)
    assert month.reserved_cost == Decimal("0.70")  # the day's refusal rolled back
    exact = budget_reserve(
        budget=budget,
        run_id=uuid.uuid4(),
        kind="model_call",
        amounts=Amounts(cost=Decimal("0.30")),
        now=NOON,
    )
    assert isinstance(exact, BudgetLedgerEntry)  # up to the limit exactly is fine


def test_month_limit_refusal_names_the_month_and_rolls_back_the_day(
    tenant, make_budget
):
    budget = make_budget(
        tenant,
        period_limits={"day": {"output_tokens": 1000}, "month": {"output_tokens": 50}},
    )
    refused = budget_reserve(
        budget=budget,
        run_id=uuid.uuid4(),
        kind="model_call",
        amounts=Amounts(output_tokens=60),
        now=NOON,
    )
    assert isinstance(refused, BudgetRefusal)
    assert refused.dimension == "tenant_output_tokens_per_month"
    assert counter_sums("day").reserved_output_tokens == 0
    assert BudgetLedgerEntry.objects.count() == 0


def test_settle_moves_the_reservation_to_actual_use_and_frees_the_rest(
    tenant, make_budget
):
    budget = make_budget(tenant, period_limits={"day": {"cost": "1.00"}})
    entry = budget_reserve(
        budget=budget,
        run_id=uuid.uuid4(),
        kind="model_call",
        amounts=Amounts(input_tokens=100, output_tokens=100, cost=Decimal("0.90")),
        now=NOON,
    )
    assert isinstance(entry, BudgetLedgerEntry)
    assert budget_settle(
        entry, Amounts(input_tokens=80, output_tokens=20, cost=Decimal("0.25"))
    )
    counter = counter_sums("day")
    assert (counter.reserved_cost, counter.used_cost) == (0, Decimal("0.25"))
    assert (counter.reserved_input_tokens, counter.used_input_tokens) == (0, 80)
    assert (counter.reserved_output_tokens, counter.used_output_tokens) == (0, 20)
    entry.refresh_from_db()
    assert entry.status == "settled" and entry.actual["cost"] == "0.25"
    assert not budget_release(entry)  # settled: nothing to give back
    assert counter_sums("day").used_cost == Decimal("0.25")


def test_release_gives_everything_back_once(tenant, make_budget):
    budget = make_budget(tenant, period_limits={"day": {"cost": "1.00"}})
    run_id = uuid.uuid4()
    for _ in range(2):
        budget_reserve(
            budget=budget,
            run_id=run_id,
            kind="model_call",
            amounts=Amounts(cost=Decimal("0.30")),
            now=NOON,
        )
    assert budget_release_for_run(run_id=run_id) == 2
    assert budget_release_for_run(run_id=run_id) == 0
    assert day_totals(tenant)["cost"] == 0
    assert set(BudgetLedgerEntry.objects.values_list("status", flat=True)) == {
        "released"
    }


def test_settling_after_a_release_by_recovery_still_records_the_spend(
    tenant, make_budget
):
    budget = make_budget(tenant, period_limits={"day": {"cost": "1.00"}})
    entry = budget_reserve(
        budget=budget,
        run_id=uuid.uuid4(),
        kind="model_call",
        amounts=Amounts(cost=Decimal("0.50")),
        now=NOON,
    )
    assert isinstance(entry, BudgetLedgerEntry)
    assert budget_release(entry)
    assert not budget_settle(entry, Amounts(cost=Decimal("0.20")))
    counter = counter_sums("day")
    assert (counter.reserved_cost, counter.used_cost) == (0, Decimal("0.20"))


def test_calendar_rollover_restores_capacity(tenant, make_budget):
    budget = make_budget(tenant, period_limits={"day": {"runs": 1}})
    first = budget_reserve(
        budget=budget, run_id=uuid.uuid4(), kind="run", amounts=Amounts(runs=1),
        now=NOON,
    )  # fmt: skip
    assert isinstance(first, BudgetLedgerEntry)
    again = budget_reserve(
        budget=budget, run_id=uuid.uuid4(), kind="run", amounts=Amounts(runs=1),
        now=NOON + dt.timedelta(hours=11),
    )  # fmt: skip
    assert isinstance(again, BudgetRefusal)
    assert again.dimension == "tenant_runs_per_day"
    tomorrow = budget_reserve(
        budget=budget, run_id=uuid.uuid4(), kind="run", amounts=Amounts(runs=1),
        now=NOON + dt.timedelta(hours=12),
    )  # fmt: skip
    assert isinstance(tomorrow, BudgetLedgerEntry)


def test_rolling_window_counts_the_last_24_hours_across_midnight(tenant, make_budget):
    budget = make_budget(
        tenant, period_mode="rolling", period_limits={"day": {"input_tokens": 100}}
    )
    late = dt.datetime(2026, 3, 14, 23, 10, tzinfo=dt.UTC)
    entry = budget_reserve(
        budget=budget, run_id=uuid.uuid4(), kind="model_call",
        amounts=Amounts(input_tokens=80), now=late,
    )  # fmt: skip
    assert isinstance(entry, BudgetLedgerEntry)
    after_midnight = late + dt.timedelta(hours=2)
    refused = budget_reserve(
        budget=budget, run_id=uuid.uuid4(), kind="model_call",
        amounts=Amounts(input_tokens=30), now=after_midnight,
    )  # fmt: skip
    assert isinstance(refused, BudgetRefusal)  # a calendar day would have reset
    assert refused.dimension == "tenant_input_tokens_per_day"
    next_evening = late + dt.timedelta(hours=25)
    later = budget_reserve(
        budget=budget, run_id=uuid.uuid4(), kind="model_call",
        amounts=Amounts(input_tokens=30), now=next_evening,
    )  # fmt: skip
    assert isinstance(later, BudgetLedgerEntry)


@pytest.mark.parametrize("mode", ["calendar", "rolling"])
@pytest.mark.django_db(transaction=True)
def test_concurrent_reservations_never_overspend(tenant, make_budget, mode):
    """8 threads, each with its own connection, race for a limit that fits 7."""
    budget = make_budget(
        tenant, period_mode=mode, period_limits={"day": {"cost": "0.70"}}
    )
    results: list[object] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        try:
            barrier.wait()
            for _ in range(3):
                results.append(
                    budget_reserve(
                        budget=budget,
                        run_id=uuid.uuid4(),
                        kind="model_call",
                        amounts=Amounts(cost=Decimal("0.10")),
                    )
                )
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    granted = [r for r in results if isinstance(r, BudgetLedgerEntry)]
    refused = [r for r in results if isinstance(r, BudgetRefusal)]
    assert len(results) == 24
    assert len(granted) == 7
    assert {r.dimension for r in refused} == {"tenant_cost_per_day"}
    assert BudgetLedgerEntry.objects.count() == 7
    from django.utils import timezone

    assert window_totals(tenant.pk, mode, "day", timezone.now())["cost"] == Decimal(
        "0.70"
    )


@pytest.mark.parametrize("mode", ["calendar", "rolling"])
def test_a_bucket_deleted_behind_the_cache_is_created_again(tenant, make_budget, mode):
    budget = make_budget(tenant, period_mode=mode, period_limits={"day": {"runs": 5}})
    one = Amounts(runs=1)
    budget_reserve(budget=budget, run_id=uuid.uuid4(), kind="run", amounts=one)
    BudgetCounter.objects.all().delete()
    entry = budget_reserve(budget=budget, run_id=uuid.uuid4(), kind="run", amounts=one)
    assert isinstance(entry, BudgetLedgerEntry)
    sums = [counter_sums(period).reserved_runs for period in ("day", "month")]
    assert sums == [1, 1]


@pytest.mark.django_db(transaction=True)
def test_rolling_reservation_reads_the_limits_under_the_lock(tenant, make_budget):
    """A limit lowered after the caller read the budget holds the reservation."""
    budget = make_budget(
        tenant, period_mode="rolling", period_limits={"day": {"input_tokens": 100}}
    )
    type(budget).objects.filter(id=budget.id).update(
        period_limits={"day": {"input_tokens": 50}}
    )
    refused = budget_reserve(
        budget=budget, run_id=uuid.uuid4(), kind="model_call",
        amounts=Amounts(input_tokens=60),
    )  # fmt: skip
    assert isinstance(refused, BudgetRefusal)
    assert BudgetLedgerEntry.objects.count() == 0
    assert counter_sums("day").reserved_input_tokens == 0
