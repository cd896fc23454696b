"""The ledger's slots: a calendar bucket split into rows holding shares of the
headroom (budgets/ledger.py), and the guarantees that must survive the split."""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, connections, transaction

from budgets.ledger import SLOTS, budget_release, budget_reserve, budget_settle
from budgets.models import Budget, BudgetCounter, BudgetLedgerEntry
from budgets.periods import Amounts, BudgetRefusal
from budgets.services import budget_update

CENT = Amounts(cost=Decimal("0.01"))


def reserve(budget: Budget, amounts: Amounts = CENT) -> BudgetLedgerEntry | Any:
    return budget_reserve(
        budget=budget, run_id=uuid.uuid4(), kind="model_call", amounts=amounts
    )


def summed(period: str, state: str) -> Decimal:
    """The period's cost `state` over every slot, summed exactly (an SQLite
    aggregate of decimals is a float)."""
    rows = BudgetCounter.objects.filter(period=period)
    return sum((getattr(row, f"{state}_cost") for row in rows), Decimal(0))


def slot_of(counter_id: int) -> BudgetCounter:
    return BudgetCounter.objects.get(id=counter_id)


def test_a_calendar_bucket_is_divided_into_slots_whose_quotas_add_up_to_the_limit(
    tenant, make_budget
):
    budget = make_budget(tenant, period_limits={"day": {"cost": "0.50"}})
    entry = reserve(budget)
    assert isinstance(entry, BudgetLedgerEntry)
    day = BudgetCounter.objects.filter(tenant=tenant, period="day")
    assert day.count() == SLOTS
    assert sum(row.quota_cost for row in day) == Decimal("0.50")
    assert all(row.quota_input_tokens is None for row in day)  # no limit on it
    assert summed("day", "reserved") == Decimal("0.01")


def test_exactly_the_limit_is_granted_down_to_the_last_unit(tenant, make_budget):
    """50 cents over 16 slots: the shares run short long before the limit, and
    the last cents are still granted (the locked path sees the whole bucket)."""
    budget = make_budget(tenant, period_limits={"day": {"cost": "0.50"}})
    results = [reserve(budget) for _ in range(52)]
    granted = [r for r in results if isinstance(r, BudgetLedgerEntry)]
    assert len(granted) == 50
    assert all(isinstance(r, BudgetRefusal) for r in results[50:])
    assert results[50].dimension == "tenant_cost_per_day"
    day = BudgetCounter.objects.filter(tenant=tenant, period="day")
    assert sum(row.reserved_cost for row in day) == Decimal("0.50")
    # The reservations were spread over the slots, not all on one row.
    assert len({entry.counter_ids[0] for entry in granted}) > 1


@pytest.mark.parametrize("through_the_service", [True, False])
def test_a_lowered_limit_applies_to_the_next_reservation(
    tenant, make_budget, through_the_service
):
    """The slots' quotas were divided from the old limit; the next reservation,
    even with the budget object read before the edit, is held to the new one."""
    budget = make_budget(tenant, period_limits={"day": {"cost": "1.00"}})
    assert isinstance(reserve(budget), BudgetLedgerEntry)
    if through_the_service:
        budget_update(
            tenant=tenant, actor=None, data={"limits": {"day": {"cost": "0.02"}}}
        )
    else:
        Budget.objects.filter(id=budget.id).update(
            period_limits={"day": {"cost": "0.02"}}
        )
    assert isinstance(reserve(budget), BudgetLedgerEntry)  # 0.02 of 0.02
    refused = reserve(budget)
    assert isinstance(refused, BudgetRefusal)
    assert refused.limit == Decimal("0.02")
    assert summed("day", "reserved") == Decimal("0.02")


def test_a_raised_limit_is_divided_again(tenant, make_budget):
    budget = make_budget(tenant, period_limits={"day": {"cost": "0.01"}})
    assert isinstance(reserve(budget), BudgetLedgerEntry)
    assert isinstance(reserve(budget), BudgetRefusal)
    budget_update(tenant=tenant, actor=None, data={"limits": {"day": {"cost": "0.03"}}})
    assert [isinstance(reserve(budget), BudgetLedgerEntry) for _ in range(3)] == [
        True,
        True,
        False,
    ]


def test_settle_and_release_give_the_headroom_back_to_the_reserving_slot(
    tenant, make_budget
):
    budget = make_budget(tenant, period_limits={"day": {"cost": "1.00"}})
    settled = reserve(budget, Amounts(cost=Decimal("0.10")))
    released = reserve(budget, Amounts(cost=Decimal("0.20")))
    assert isinstance(settled, BudgetLedgerEntry)
    assert isinstance(released, BudgetLedgerEntry)
    day_slot, month_slot = settled.counter_ids
    assert slot_of(day_slot).period == "day"
    assert slot_of(month_slot).period == "month"
    reserved_before = {
        counter_id: slot_of(counter_id).reserved_cost
        for counter_id in {*settled.counter_ids, *released.counter_ids}
    }

    assert budget_settle(settled, Amounts(cost=Decimal("0.04")))
    for counter_id in settled.counter_ids:
        row = slot_of(counter_id)
        assert row.used_cost == Decimal("0.04")
        assert row.reserved_cost == reserved_before[counter_id] - Decimal("0.10")
    assert budget_release(released)
    for counter_id in released.counter_ids:
        assert slot_of(counter_id).reserved_cost == 0
    day = BudgetCounter.objects.filter(tenant=tenant, period="day")
    assert sum(row.used_cost for row in day) == Decimal("0.04")
    assert sum(row.reserved_cost for row in day) == 0


def test_use_beyond_a_reservation_is_seen_by_every_slot(tenant, make_budget):
    """A slot's use beyond its reservation must not leave the other slots'
    shares intact: 15.95 of 16.00 spent, another 0.10 does not fit."""
    budget = make_budget(tenant, period_limits={"day": {"cost": "16.00"}})
    entry = reserve(budget, Amounts(cost=Decimal("0.10")))
    assert isinstance(entry, BudgetLedgerEntry)
    budget_settle(entry, Amounts(cost=Decimal("15.95")))
    refused = reserve(budget, Amounts(cost=Decimal("0.10")))
    assert isinstance(refused, BudgetRefusal)
    assert isinstance(reserve(budget, Amounts(cost=Decimal("0.05"))), BudgetLedgerEntry)
    assert summed("day", "used") == Decimal("15.95")


def test_rolling_writes_on_divided_rows_leave_no_slot_usable(tenant, make_budget):
    """A rolling reservation on a row a calendar bucket divided (the same day
    bucket) bypasses the quotas; back in calendar mode the bucket is divided
    again before a slot is used."""
    budget = make_budget(tenant, period_limits={"day": {"cost": "16.00"}})
    assert isinstance(reserve(budget), BudgetLedgerEntry)
    budget.period_mode = Budget.PeriodMode.ROLLING
    budget.save()
    rows = BudgetCounter.objects.filter(tenant=tenant, period="day")
    assert rows.filter(quota_limits__isnull=False).exists()
    # Reserve at the start of the calendar day: the rolling hour bucket is the
    # calendar day bucket's slot 0.
    day_start = rows.first().bucket_start
    entry = budget_reserve(
        budget=budget, run_id=uuid.uuid4(), kind="model_call",
        amounts=Amounts(cost=Decimal("15.00")), now=day_start,
    )  # fmt: skip
    assert isinstance(entry, BudgetLedgerEntry)
    assert not rows.filter(bucket_start=day_start, quota_limits__isnull=False).exists()


# ---------------------------------------------------------------- PostgreSQL

postgres_only = pytest.mark.skipif(
    "postgres" not in (connection.settings_dict.get("ENGINE") or ""),
    reason="row locks and SKIP LOCKED: PostgreSQL",
)


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_writer_skips_a_slot_another_holds_instead_of_waiting(tenant, make_budget):
    budget = make_budget(tenant, period_limits={"day": {"cost": "1.00"}})
    first = reserve(budget)
    assert isinstance(first, BudgetLedgerEntry)
    held = threading.Event()
    done = threading.Event()

    def hold_the_first_slots() -> None:
        try:
            with transaction.atomic():
                list(
                    BudgetCounter.objects.select_for_update().filter(
                        id__in=first.counter_ids
                    )
                )
                held.set()
                done.wait(timeout=30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_the_first_slots)
    holder.start()
    try:
        assert held.wait(timeout=30)
        second = reserve(budget)  # would block here if it waited for the lock
        assert isinstance(second, BudgetLedgerEntry)
        assert set(second.counter_ids).isdisjoint(first.counter_ids)
    finally:
        done.set()
        holder.join()


def _reserve_until_refused(budget_id: int, results: Any) -> None:
    """A writer process: its own connection, reserving cents until refused."""
    connections.close_all()
    budget = Budget.objects.get(id=budget_id)
    granted = 0
    try:
        while isinstance(reserve(budget), BudgetLedgerEntry):
            granted += 1
    finally:
        connections.close_all()
        results.put(granted)


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_writer_processes_racing_for_a_limit_get_exactly_the_limit(tenant, make_budget):
    """6 processes, each with its own connection, reserve cents until refused:
    exactly the 50 that fit are granted, and the counters hold exactly them."""
    budget = make_budget(
        tenant, period_limits={"day": {"cost": "0.50"}, "month": {"cost": "0.70"}}
    )
    # A forked child must not share the parent's socket, nor inherit the pool's
    # threads' locks held.
    connections.close_all()
    for database in connections.all():
        if hasattr(database, "close_pool"):
            database.close_pool()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    writers = [
        context.Process(target=_reserve_until_refused, args=(budget.id, results))
        for _ in range(6)
    ]
    for writer in writers:
        writer.start()
    granted = [results.get(timeout=120) for _ in writers]
    for writer in writers:
        writer.join(timeout=30)
    assert sum(granted) == 50
    assert BudgetLedgerEntry.objects.filter(tenant=tenant).count() == 50
    assert summed("day", "reserved") == Decimal("0.50")
    assert summed("month", "reserved") == Decimal("0.50")
