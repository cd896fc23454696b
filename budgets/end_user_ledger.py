"""Per-end-user period limits, on the same reservations as the tenant's.

A run that serves an end user (`Run.end_user`) reserves every model call, tool
call and run start against that end user's limits too (`Budget.end_user_limits`,
the shape of `period_limits`). The tenant's counters are reserved first and the
end user's counter rows (one per period bucket) are locked after them, in id
order, in the same transaction: a refusal by the end user's limit rolls the
tenant's reservation back, so nothing is held or written. Settling and releasing
move the end user's counters after the tenant's, the same lock order.

Calendar mode counts the UTC day and month; rolling mode sums the hour (day) or
day (month) buckets of the window, as the tenant's counters do.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.db.models import F, Q, Value

from budgets.models import PERIOD_DIMENSIONS, PERIODS, Budget, EndUserBudgetCounter
from budgets.periods import (
    Amounts,
    BudgetRefusal,
    bucket_start,
    limits_of_period,
    window_filter,
)


def end_user_limited(budget: Budget) -> bool:
    """Whether the budget sets any per-end-user limit."""
    return any(limits_of_period(budget.end_user_limits, period) for period in PERIODS)


def end_user_refusal_dimension(dimension: str, period: str) -> str:
    return f"end_user_{dimension}_per_{period}"


def _window_rows(
    budget: Budget, end_user: str, now: dt.datetime
) -> list[EndUserBudgetCounter]:
    """The end user's counters of both windows, locked in id order; the current
    buckets created if missing."""
    mode = budget.period_mode
    windows = Q()
    for period in PERIODS:
        windows |= window_filter(mode, period, now)
    EndUserBudgetCounter.objects.bulk_create(
        [
            EndUserBudgetCounter(
                tenant_id=budget.tenant_id,
                end_user=end_user,
                period=period,
                bucket_start=bucket_start(mode, period, now),
            )
            for period in PERIODS
        ],
        ignore_conflicts=True,
    )
    return list(
        EndUserBudgetCounter.objects.select_for_update()
        .filter(windows, tenant_id=budget.tenant_id, end_user=end_user)
        .order_by("id")
    )


def end_user_reserve(
    *,
    budget: Budget,
    end_user: str,
    amounts: Amounts,
    limits: dict[str, Any],
    now: dt.datetime,
) -> list[int] | BudgetRefusal:
    """Reserve `amounts` on the end user's current buckets, or the refusal of
    the first limit it would cross (nothing written). Call inside the
    transaction that reserved the tenant's counters, after them. `limits`: the
    end user limits read under the budget's lock or with the budget."""
    rows = _window_rows(budget, end_user, now)
    mode = budget.period_mode
    current: dict[str, EndUserBudgetCounter] = {}
    for period in PERIODS:
        start = bucket_start(mode, period, now)
        mine = [row for row in rows if row.period == period]
        current[period] = next(row for row in mine if row.bucket_start == start)
        period_limits = limits_of_period(limits, period)
        for name in PERIOD_DIMENSIONS:
            wanted = amounts.get(name)
            if name not in period_limits or wanted <= 0:
                continue
            total = sum(
                (
                    getattr(r, f"used_{name}") + getattr(r, f"reserved_{name}")
                    for r in mine
                ),
                Decimal(0) if name == "cost" else 0,
            )
            limit = period_limits[name]
            if total + wanted > limit:
                return BudgetRefusal(
                    end_user_refusal_dimension(name, period),
                    f"end user {end_user!r}'s limit of {name} per {period} is "
                    f"{limit}; {total} is used or reserved and this needs {wanted}",
                    name=name,
                    limit=Decimal(limit),
                    total=Decimal(total),
                    wanted=Decimal(wanted),
                    needed=Decimal(wanted),
                )
    ids = sorted(row.id for row in current.values())
    for row in sorted(current.values(), key=lambda r: r.id):
        changes = {
            f"reserved_{name}": F(f"reserved_{name}") + Value(amounts.get(name))
            for name in PERIOD_DIMENSIONS
            if amounts.get(name)
        }
        if changes:
            EndUserBudgetCounter.objects.filter(id=row.id).update(**changes)
    return ids


def end_user_settle(
    counter_ids: list[int], *, actual: Amounts, reserved: Amounts | None
) -> None:
    """Add the actual use to the end user's counters, and give the reservation
    back when `reserved` (the caller won the ledger row's compare-and-set).
    Call after the tenant's counters moved, in the same transaction."""
    for counter_id in sorted(counter_ids):
        changes: dict[str, Any] = {}
        for name in PERIOD_DIMENSIONS:
            used = actual.get(name)
            if used:
                changes[f"used_{name}"] = F(f"used_{name}") + Value(used)
            back = reserved.get(name) if reserved is not None else 0
            if back:
                changes[f"reserved_{name}"] = F(f"reserved_{name}") - Value(back)
        if changes:
            EndUserBudgetCounter.objects.filter(id=counter_id).update(**changes)


def end_user_usage(
    *, budget: Budget, end_user: str, now: dt.datetime
) -> dict[str, dict[str, Any]]:
    """The end user's use and reservations per period (a read, no lock)."""
    mode = budget.period_mode
    usage: dict[str, dict[str, Any]] = {}
    for period in PERIODS:
        rows = EndUserBudgetCounter.objects.filter(
            window_filter(mode, period, now),
            tenant_id=budget.tenant_id,
            end_user=end_user,
        )
        totals: dict[str, Any] = {}
        for name in PERIOD_DIMENSIONS:
            zero: Any = Decimal(0) if name == "cost" else 0
            used = sum((getattr(r, f"used_{name}") for r in rows), zero)
            held = sum((getattr(r, f"reserved_{name}") for r in rows), zero)
            totals[name] = {
                "used": str(used) if name == "cost" else used,
                "reserved": str(held) if name == "cost" else held,
            }
        usage[period] = totals
    return usage
