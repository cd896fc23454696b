"""The budget ledger: reserve before spending, settle after, release the rest.

Enforcement is atomic, and no interleaving of writers overspends a limit. The
ledger allocates budget the way a shop allocates stock, with row locks:

- Calendar mode on PostgreSQL, when the reservation fits: one statement locks
  the day and the month counter, checks, grows them and inserts the ledger row
  (budgets/ledger_sql.py, with the benchmark figure that keeps it).
- Otherwise (it does not fit, rolling windows, grants, SQLite): the `Budget`
  row is locked (`select_for_update`), then the window's counters in id order;
  the totals are checked against the limits read under the lock (an edit takes
  the same lock), and the refusal names the exact dimension and changes nothing.

Periods. Calendar mode counts the UTC day and the UTC month, one counter row
each. Rolling mode has hour buckets (summed over the last 24 hours) and day
buckets (summed over 30 days); the current buckets grow.

Settling and releasing take no budget lock: the ledger row's compare-and-set
(`reserved` to `settled` or `released`) decides who gives the reservation back,
and the counters move (the ledger row first, then the counters in id order, as
a reservation locks them: one lock order everywhere); on PostgreSQL one
statement does it (ledger_sql), else `F()` updates.

Grants. A run's approved extension of a period limit is its own row
(`BudgetGrant`): once the tenant's limit refuses the run, the granted dimension
is reserved from the grant instead of the counters (the entry's `funding`), so
the period's total stays within the limit plus the grants.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import F, Q, Value
from django.utils import timezone

from budgets import ledger_sql
from budgets.models import (
    PERIOD_DIMENSIONS,
    PERIODS,
    Budget,
    BudgetCounter,
    BudgetGrant,
    BudgetLedgerEntry,
)
from budgets.periods import (
    Amounts,
    BudgetRefusal,
    bucket_start,
    limits_of_period,
    refusal_dimension,
    window_filter,
)

# ---------------------------------------------------------------- grants


def _grants_with_room(
    budget: Budget, run_id: Any, amounts: Amounts, now: dt.datetime
) -> list[BudgetGrant]:
    """The run's grants in the current window that could fund this reservation."""
    wanted = [name for name in PERIOD_DIMENSIONS if amounts.get(name) > 0]
    if not wanted:
        return []
    windows = Q()
    for period in PERIODS:
        windows |= window_filter(budget.period_mode, period, now)
    grants = BudgetGrant.objects.filter(
        windows, tenant_id=budget.tenant_id, run_id=run_id, dimension__in=wanted
    ).order_by("period", "bucket_start")
    chosen: dict[tuple[str, str], BudgetGrant] = {}
    for grant in grants:
        room = grant.amount - grant.used - grant.reserved
        key = (grant.period, grant.dimension)
        if key not in chosen and room >= amounts.get(grant.dimension):
            chosen[key] = grant
    return list(chosen.values())


def _excluded(funding: list[dict[str, Any]], period: str) -> set[str]:
    return {part["dimension"] for part in funding if part["period"] == period}


# ---------------------------------------------------------------- reserve


def budget_reserve(
    *,
    budget: Budget,
    run_id: Any,
    kind: str,
    amounts: Amounts,
    step_index: int | None = None,
    call_id: str = "",
    now: dt.datetime | None = None,
) -> BudgetLedgerEntry | BudgetRefusal:
    """Reserve `amounts` against every period limit, or refuse and change nothing.

    A run holding grants (approved extensions) that the tenant's limit refused
    reserves the granted dimensions from its grants instead.
    """
    now = now or timezone.now()
    fields = {
        "tenant_id": budget.tenant_id,
        "run_id": run_id,
        "step_index": step_index,
        "call_id": call_id,
        "kind": kind,
        "reserved": amounts.to_dict(),
    }
    result = _reserve(budget, amounts, fields, now, [])
    if not isinstance(result, BudgetRefusal) or not result.period:
        return result
    grants = _grants_with_room(budget, run_id, amounts, now)
    if not grants:
        return result
    funding = [
        {"grant": grant.pk, "period": grant.period, "dimension": grant.dimension}
        for grant in grants
    ]
    return _reserve(budget, amounts, fields, now, funding)


def _reserve(
    budget: Budget,
    amounts: Amounts,
    fields: dict[str, Any],
    now: dt.datetime,
    funding: list[dict[str, Any]],
) -> BudgetLedgerEntry | BudgetRefusal:
    if (
        budget.period_mode == Budget.PeriodMode.CALENDAR
        and not funding
        and connection.vendor == "postgresql"
    ):
        entry = ledger_sql.reserve(
            budget_id=budget.id,
            fields=fields,
            amounts=amounts,
            day=bucket_start(budget.period_mode, "day", now),
            month=bucket_start(budget.period_mode, "month", now),
        )
        if entry is not None:
            return entry
    return _reserve_locked(budget, amounts, fields, now, funding)


def _reserve_locked(
    budget: Budget,
    amounts: Amounts,
    fields: dict[str, Any],
    now: dt.datetime,
    funding: list[dict[str, Any]],
) -> BudgetLedgerEntry | BudgetRefusal:
    """The budget row locked (`select_for_update`), then the window's counters
    (in id order): check every period's window against the limits read under
    the lock, then grow the current buckets and insert the entry. Rolling mode,
    grants, SQLite, and every calendar reservation that did not fit at once."""
    with transaction.atomic():
        locked = (
            Budget.objects.select_for_update()
            .filter(id=budget.id)
            .values_list("period_limits", "period_mode")
            .first()
        )
        period_limits, mode = locked if locked is not None else ({}, budget.period_mode)
        current, totals = _window_counters(budget.tenant_id, mode, now)
        for period in PERIODS:
            refusal = _over_limit(
                period, limits_of_period(period_limits, period), totals[period],
                amounts, _excluded(funding, period),
            )  # fmt: skip
            if refusal is not None:
                return refusal
        refused = _charge_grants(funding, amounts)
        if refused is not None:
            transaction.set_rollback(True)
            return refused
        _counters_add(
            current,
            {
                period: {
                    f"reserved_{name}": amounts.get(name)
                    for name in PERIOD_DIMENSIONS
                    if name not in _excluded(funding, period)
                }
                for period in PERIODS
            },
        )
        return BudgetLedgerEntry.objects.create(
            counter_ids=[current[p] for p in PERIODS], funding=funding, **fields
        )


def _window_counters(
    tenant_id: Any, mode: str, now: dt.datetime
) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
    """The current bucket's counter id per period (created if missing) and the
    used + reserved totals of each period's window, in one read that locks the
    rows in id order (the one lock order of every ledger write)."""
    starts = {period: bucket_start(mode, period, now) for period in PERIODS}
    windows = Q()
    for period in PERIODS:
        windows |= window_filter(mode, period, now)
    for _attempt in range(2):
        rows = list(
            BudgetCounter.objects.select_for_update()
            .filter(windows, tenant_id=tenant_id)
            .order_by("id")
        )
        current = {
            row.period: row.id for row in rows if row.bucket_start == starts[row.period]
        }
        missing = [period for period in PERIODS if period not in current]
        if not missing:
            totals = {
                period: _totals([row for row in rows if row.period == period])
                for period in PERIODS
            }
            return current, totals
        # A new bucket: made once (the unique constraint), then read again.
        BudgetCounter.objects.bulk_create(
            [
                BudgetCounter(tenant_id=tenant_id, period=p, bucket_start=starts[p])
                for p in missing
            ],
            ignore_conflicts=True,
        )
    raise RuntimeError("the budget's current counters could not be created")


def _counters_add(
    counter_ids: dict[str, int], deltas: dict[str, dict[str, Any]]
) -> None:
    """Add each period's deltas to its counter by an `F()` update, one counter
    at a time in id order (the one lock order: no deadlock between writers)."""
    for period in sorted(counter_ids, key=counter_ids.__getitem__):
        changes = {k: v for k, v in deltas[period].items() if v}
        if changes:
            BudgetCounter.objects.filter(id=counter_ids[period]).update(
                **{field: F(field) + Value(delta) for field, delta in changes.items()}
            )


def _charge_grants(
    funding: list[dict[str, Any]], amounts: Amounts
) -> BudgetRefusal | None:
    """Reserve the funded dimensions from the run's grants (conditionally)."""
    for part in funding:
        wanted = Decimal(amounts.get(part["dimension"]))
        granted = BudgetGrant.objects.filter(
            id=part["grant"], amount__gte=F("used") + F("reserved") + Value(wanted)
        ).update(reserved=F("reserved") + Value(wanted))
        if not granted:
            grant = BudgetGrant.objects.get(id=part["grant"])
            return _refusal(
                part["period"], part["dimension"], grant.amount,
                grant.used + grant.reserved, wanted, granted=True,
            )  # fmt: skip
    return None


def _totals(rows: list[BudgetCounter]) -> dict[str, Any]:
    return {
        name: sum(
            (getattr(r, f"used_{name}") + getattr(r, f"reserved_{name}") for r in rows),
            Decimal(0) if name == "cost" else 0,
        )
        for name in PERIOD_DIMENSIONS
    }


def _over_limit(
    period: str,
    limits: dict[str, Any],
    totals: dict[str, Any],
    amounts: Amounts,
    excluded: set[str],
) -> BudgetRefusal | None:
    """The refusal for the first dimension `amounts` would take over its limit."""
    for name in PERIOD_DIMENSIONS:
        wanted = amounts.get(name)
        if name in excluded or name not in limits or wanted <= 0:
            continue
        if totals[name] + wanted > limits[name]:
            return _refusal(period, name, limits[name], totals[name], wanted)
    return None


def _refusal(
    period: str,
    name: str,
    limit: Any,
    total: Any,
    wanted: Any,
    *,
    granted: bool = False,
) -> BudgetRefusal:
    held_to = "this run's extension" if granted else "the tenant's limit"
    return BudgetRefusal(
        refusal_dimension(name, period),
        f"{held_to} of {name} per {period} is {limit}; "
        f"{total} is used or reserved and this needs {wanted}",
        period=period,
        name=name,
        limit=Decimal(limit),
        total=Decimal(total),
        wanted=Decimal(wanted),
        # A grant funds a dimension whole: it must hold all of the reservation.
        needed=Decimal(total + wanted - limit) if granted else Decimal(wanted),
    )


# ---------------------------------------------------------------- settle


def _settle(entry: BudgetLedgerEntry, actual: Amounts, status: str) -> bool:
    """The ledger row's compare-and-set, then the counters and the grants: the
    actual use is added always (the spend happened), the reservation given back
    only by the call that won the compare-and-set."""
    reserved = Amounts.from_dict(entry.reserved)
    funding = list(entry.funding or [])
    if (
        connection.vendor == "postgresql"
        and not funding
        and len(entry.counter_ids) == len(PERIODS)
    ):
        return ledger_sql.settle(
            entry=entry, actual=actual, reserved=reserved, status=status
        )
    with transaction.atomic():
        won = BudgetLedgerEntry.objects.filter(
            id=entry.id, status=BudgetLedgerEntry.Status.RESERVED
        ).update(
            status=status,
            actual=None if status == "released" else actual.to_dict(),
            settled_at=timezone.now(),
        )
        counters = dict(zip(PERIODS, entry.counter_ids, strict=False))
        deltas: dict[str, dict[str, Any]] = {}
        for period in counters:
            excluded = _excluded(funding, period)
            deltas[period] = {}
            for name in PERIOD_DIMENSIONS:
                if name in excluded:
                    continue
                deltas[period][f"used_{name}"] = actual.get(name)
                if won:
                    deltas[period][f"reserved_{name}"] = -reserved.get(name)
        _counters_add(counters, deltas)
        for part in funding:  # after the counters: one lock order everywhere
            name = part["dimension"]
            grant_changes: dict[str, Any] = {
                "used": F("used") + Value(Decimal(actual.get(name)))
            }
            if won:
                grant_changes["reserved"] = F("reserved") - Value(
                    Decimal(reserved.get(name))
                )
            BudgetGrant.objects.filter(id=part["grant"]).update(**grant_changes)
    return bool(won)


def budget_settle(entry: BudgetLedgerEntry, actual: Amounts) -> bool:
    """Move the reservation to used with the actual amounts (never refused: the
    spend happened). A reservation already released by recovery only adds its use.
    Returns whether this call settled the reservation itself."""
    status = BudgetLedgerEntry.Status.SETTLED
    settled = _settle(entry, actual, status)
    if not settled:  # released before: keep what was spent on the entry too
        BudgetLedgerEntry.objects.filter(id=entry.id).update(
            actual=actual.to_dict(), settled_at=timezone.now()
        )
    entry.status = status
    entry.actual = actual.to_dict()
    return settled


def budget_release(entry: BudgetLedgerEntry) -> bool:
    """Give a reservation back without use; a no-op once settled or released."""
    return _settle(entry, Amounts(), BudgetLedgerEntry.Status.RELEASED)


def budget_release_for_run(*, run_id: Any) -> int:
    """Release every open reservation of a run (its step crashed or it ended)."""
    released = 0
    for entry in BudgetLedgerEntry.objects.filter(
        run_id=run_id, status=BudgetLedgerEntry.Status.RESERVED
    ):
        released += budget_release(entry)
    return released
