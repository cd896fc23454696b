"""The budget ledger: reserve before spending, settle after, release the rest.

Enforcement is atomic, and no interleaving of writers overspends a limit. The
ledger allocates budget the way a shop allocates stock, with sharded counters
and row locks:

- Slots. A calendar bucket (the UTC day, the UTC month) is `SLOTS` counter rows;
  each holds its use plus a share of the headroom in its `quota_*` columns, the
  shares adding up to the limit, stamped with the limits they were divided from
  (`quota_limits`). A reservation locks the first free slot of the day and of
  the month with room (`select_for_update(skip_locked=True)`: writers never
  wait for each other), grows both and inserts the entry. On PostgreSQL that is
  one statement (budgets/ledger_sql.py, with the figure that keeps it), else
  the ORM (`_reserve_on_slots`).
- The locked path. When no free slot has room (or the stamp is not the
  budget's limits as they are: an edit), or in rolling mode, or for grants: the
  `Budget` row is locked (`select_for_update`), then every counter row of the
  window in id order; the totals are checked against the limits read under the
  lock, so the last units of headroom are still granted, and the refusal names
  the exact dimension and changes nothing. In calendar mode the reservation goes
  on slot 0 and what is left of each limit is divided between the slots again.

Periods. Calendar mode counts the UTC day and the UTC month. Rolling mode has
hour buckets (summed over the last 24 hours) and day buckets (summed over 30
days), one row each (slot 0); the current buckets grow. A rolling write on a
row a calendar bucket divided clears the bucket's stamps.

Settling and releasing take no budget lock: the ledger row's compare-and-set
(`reserved` to `settled` or `released`) decides who gives the reservation back,
and the entry's own slots move (the ledger row first, then the counters in id
order, as a reservation locks them: one lock order everywhere); on PostgreSQL
one statement does it (ledger_sql), else `F()` updates. A use beyond its
reservation clears its buckets' stamps: the other slots' shares did not count it.

Grants. A run's approved extension of a period limit is its own row
(`BudgetGrant`): once the tenant's limit refuses the run, the granted dimension
is reserved from the grant instead of the counters (the entry's `funding`), so
the period's total stays within the limit plus the grants.
"""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_FLOOR, Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Q, Value
from django.utils import timezone

from budgets import ledger_sql
from budgets.end_user_ledger import end_user_limited, end_user_reserve, end_user_settle
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

# Each calendar bucket is split into this many slot rows, each holding a share
# of the headroom, so that concurrent writers lock different rows. Kept by the
# rule of issue 23: bench_budget, 8 writers on one tenant, same session
# (2026-12-03, 2 CPUs shared, load 5): one counter row per bucket (main at
# 158edee) 120-207 reserve+settle/s, p99 100-162 ms; these slots 283-301/s,
# p99 52-54 ms (both with budgets/ledger_sql.py's statements).
SLOTS = 16
_MICRO = Decimal("0.000001")

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
    expires_at: dt.datetime | None = None,
    end_user: str = "",
) -> BudgetLedgerEntry | BudgetRefusal:
    """Reserve `amounts` against every period limit, or refuse and change nothing.

    A run holding grants (approved extensions) that the tenant's limit refused
    reserves the granted dimensions from its grants instead. `expires_at`: when
    beat releases the reservation if it is still open (external agents').
    `end_user`: the end user the run serves; their own limits (if the budget
    sets any) hold this reservation too (budgets/end_user_ledger.py).
    """
    now = now or timezone.now()
    if not end_user or not end_user_limited(budget):
        return _reserve_for_tenant(budget, run_id, kind, amounts, step_index,
                                   call_id, now, expires_at)  # fmt: skip
    with transaction.atomic():
        result = _reserve_for_tenant(
            budget, run_id, kind, amounts, step_index, call_id, now, expires_at
        )
        if isinstance(result, BudgetRefusal):
            return result
        held = end_user_reserve(
            budget=budget,
            end_user=end_user,
            amounts=amounts,
            limits=budget.end_user_limits,
            now=now,
        )
        if isinstance(held, BudgetRefusal):
            # The tenant's reservation goes back with the savepoint: nothing held.
            transaction.set_rollback(True)
            return held
        BudgetLedgerEntry.objects.filter(id=result.id).update(end_user_counter_ids=held)
        result.end_user_counter_ids = held
        return result


def _reserve_for_tenant(
    budget: Budget,
    run_id: Any,
    kind: str,
    amounts: Amounts,
    step_index: int | None,
    call_id: str,
    now: dt.datetime,
    expires_at: dt.datetime | None,
) -> BudgetLedgerEntry | BudgetRefusal:
    fields = {
        "tenant_id": budget.tenant_id,
        "run_id": run_id,
        "step_index": step_index,
        "call_id": call_id,
        "kind": kind,
        "reserved": amounts.to_dict(),
        "expires_at": expires_at,
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
    if budget.period_mode == Budget.PeriodMode.CALENDAR and not funding:
        if connection.vendor == "postgresql":
            entry = ledger_sql.reserve(
                budget_id=budget.id,
                fields=fields,
                amounts=amounts,
                day=bucket_start(budget.period_mode, "day", now),
                month=bucket_start(budget.period_mode, "month", now),
            )
        else:
            entry = _reserve_on_slots(budget, amounts, fields, now)
        if entry is not None:
            return entry
    return _reserve_locked(budget, amounts, fields, now, funding)


def _reserve_on_slots(
    budget: Budget, amounts: Amounts, fields: dict[str, Any], now: dt.datetime
) -> BudgetLedgerEntry | None:
    """The fast path: lock the first free slot of the day and of the month
    (`skip_locked`: a writer never waits for another) that has room in its
    quota, divided from the limits the budget has now, grow both by `F()`
    updates and insert the entry. None (nothing written) if no free slot has
    room: the locked path decides then, and divides the headroom again."""
    with transaction.atomic():
        slots: dict[str, BudgetCounter] = {}
        for period in PERIODS:
            free = BudgetCounter.objects.select_for_update(skip_locked=True).filter(
                tenant_id=budget.tenant_id,
                period=period,
                bucket_start=bucket_start(budget.period_mode, period, now),
            )
            if not slots:
                # The quotas hold under the limits as they are now (an edit
                # divides again under the budget's lock, holding every slot; an
                # edit that bypassed it leaves the stamp stale: the locked path).
                free = free.filter(
                    Exists(
                        Budget.objects.filter(
                            id=budget.id,
                            period_mode=Budget.PeriodMode.CALENDAR,
                            period_limits=OuterRef("quota_limits"),
                        )
                    )
                )
            slot = free.order_by("slot").first()
            while slot is not None and not _has_room(slot, amounts):
                # Short: the next free slot (rare until the bucket runs low).
                slot = free.filter(slot__gt=slot.slot).order_by("slot").first()
            if slot is None:
                return None  # nothing written: the transaction only read
            slots[period] = slot
        if slots["day"].quota_limits != slots["month"].quota_limits:
            return None
        ids = {period: slot.id for period, slot in slots.items()}
        _counters_add(
            ids,
            {
                period: {
                    f"reserved_{name}": amounts.get(name) for name in PERIOD_DIMENSIONS
                }
                for period in PERIODS
            },
        )
        return BudgetLedgerEntry.objects.create(
            counter_ids=[ids[p] for p in PERIODS], funding=[], **fields
        )


def _has_room(slot: BudgetCounter, amounts: Amounts) -> bool:
    """Whether the (locked) slot's quotas hold `amounts` besides its use."""
    for name in PERIOD_DIMENSIONS:
        wanted = amounts.get(name)
        quota = getattr(slot, f"quota_{name}")
        if wanted > 0 and quota is not None:
            held = getattr(slot, f"used_{name}") + getattr(slot, f"reserved_{name}")
            if held + wanted > quota:
                return False
    return True


def _reserve_locked(
    budget: Budget,
    amounts: Amounts,
    fields: dict[str, Any],
    now: dt.datetime,
    funding: list[dict[str, Any]],
) -> BudgetLedgerEntry | BudgetRefusal:
    """The budget row locked (`select_for_update`), then the window's counters
    (every slot, in id order): check every period's window against the limits
    read under the lock, then grow the current buckets and insert the entry.
    In calendar mode the reservation goes on slot 0 and the headroom left is
    divided between the slots again. Rolling mode, grants, and every calendar
    reservation for which no slot had room."""
    with transaction.atomic():
        locked = (
            Budget.objects.select_for_update()
            .filter(id=budget.id)
            .values_list("period_limits", "period_mode")
            .first()
        )
        period_limits, mode = locked if locked is not None else ({}, budget.period_mode)
        calendar = mode == Budget.PeriodMode.CALENDAR
        rows = _window_counters(budget.tenant_id, mode, now, calendar)
        current = {row.period: row for row in rows if row.id in _current_ids(rows)}
        for period in PERIODS:
            refusal = _over_limit(
                period, limits_of_period(period_limits, period),
                _totals([row for row in rows if row.period == period]),
                amounts, _excluded(funding, period),
            )  # fmt: skip
            if refusal is not None:
                return refusal
        refused = _charge_grants(funding, amounts)
        if refused is not None:
            transaction.set_rollback(True)
            return refused
        deltas = {
            period: {
                f"reserved_{name}": amounts.get(name)
                for name in PERIOD_DIMENSIONS
                if name not in _excluded(funding, period)
            }
            for period in PERIODS
        }
        if calendar:
            _divide(rows, period_limits, deltas)
        else:
            _counters_add({p: current[p].id for p in PERIODS}, deltas)
            _undivide(rows)
        return BudgetLedgerEntry.objects.create(
            counter_ids=[current[p].id for p in PERIODS], funding=funding, **fields
        )


def _current_ids(rows: list[BudgetCounter]) -> set[int]:
    """Slot 0 of each period's newest bucket: where the locked path reserves."""
    newest = {row.period: row.bucket_start for row in rows}
    for row in rows:
        newest[row.period] = max(newest[row.period], row.bucket_start)
    return {
        row.id
        for row in rows
        if row.slot == 0 and row.bucket_start == newest[row.period]
    }


def _window_counters(
    tenant_id: Any, mode: str, now: dt.datetime, calendar: bool
) -> list[BudgetCounter]:
    """Every counter row of the window of each period, locked in id order (the
    one lock order of every ledger write); the current buckets' slots (all
    `SLOTS` in calendar mode, slot 0 in rolling mode) created if missing."""
    starts = {period: bucket_start(mode, period, now) for period in PERIODS}
    wanted = {
        (period, slot) for period in PERIODS for slot in range(SLOTS if calendar else 1)
    }
    windows = Q()
    for period in PERIODS:
        windows |= window_filter(mode, period, now)
    for _attempt in range(2):
        rows = list(
            BudgetCounter.objects.select_for_update()
            .filter(windows, tenant_id=tenant_id)
            .order_by("id")
        )
        missing = wanted - {
            (row.period, row.slot)
            for row in rows
            if row.bucket_start == starts[row.period]
        }
        if not missing:
            return rows
        # A new bucket: made once (the unique constraint), then read again.
        BudgetCounter.objects.bulk_create(
            [
                BudgetCounter(
                    tenant_id=tenant_id, period=p, bucket_start=starts[p], slot=slot
                )
                for p, slot in sorted(missing)
            ],
            ignore_conflicts=True,
        )
    raise RuntimeError("the budget's current counters could not be created")


def _divide(
    rows: list[BudgetCounter],
    period_limits: dict[str, Any],
    deltas: dict[str, dict[str, Any]],
) -> None:
    """Add `deltas` to slot 0 of each bucket, then divide what is left of each
    limit between the bucket's slots: each gets its own use plus an equal share
    (negative when the bucket is over a lowered limit, so that no slot has room),
    slot 0 the remainder; the quotas then add up to the limit exactly. Every slot
    row is locked by the caller."""
    changed = {"quota_limits", *(f"quota_{name}" for name in PERIOD_DIMENSIONS)}
    for period in PERIODS:
        slots = [row for row in rows if row.period == period]
        for row in slots:
            if row.slot == 0:
                for field, delta in deltas[period].items():
                    if delta:
                        setattr(row, field, getattr(row, field) + delta)
                        changed.add(field)
        limits = limits_of_period(period_limits, period)
        for name in PERIOD_DIMENSIONS:
            limit = limits.get(name)
            held = [
                getattr(row, f"used_{name}") + getattr(row, f"reserved_{name}")
                for row in slots
            ]
            room = None if limit is None else limit - sum(held)
            share: Any = None
            if room is not None:
                share = (
                    (room / len(slots)).quantize(_MICRO, rounding=ROUND_FLOOR)
                    if name == "cost"
                    else room // len(slots)
                )
            for row, own in zip(slots, held, strict=True):
                quota = None
                if room is not None:
                    extra = room - share * len(slots) if row.slot == 0 else 0
                    quota = own + share + extra
                setattr(row, f"quota_{name}", quota)
        for row in slots:
            row.quota_limits = period_limits
    BudgetCounter.objects.bulk_update(rows, sorted(changed))


def _undivide(rows: list[BudgetCounter]) -> None:
    """A write that bypassed the quotas (rolling mode on rows a calendar bucket
    divided) leaves no slot usable: the next calendar reservation divides again."""
    divided = [row.id for row in rows if row.quota_limits is not None]
    if divided:
        BudgetCounter.objects.filter(id__in=divided).update(quota_limits=None)


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
    only by the call that won the compare-and-set. An end user's counters move
    last, in the same transaction (the one lock order)."""
    if not entry.end_user_counter_ids:
        return _settle_tenant(entry, actual, status)
    with transaction.atomic():
        won = _settle_tenant(entry, actual, status)
        end_user_settle(
            list(entry.end_user_counter_ids),
            actual=actual,
            reserved=Amounts.from_dict(entry.reserved) if won else None,
        )
    return won


def _settle_tenant(entry: BudgetLedgerEntry, actual: Amounts, status: str) -> bool:
    reserved = Amounts.from_dict(entry.reserved)
    funding = list(entry.funding or [])
    over = any(actual.get(name) > reserved.get(name) for name in PERIOD_DIMENSIONS)
    if (
        connection.vendor == "postgresql"
        and not funding
        and not over
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
        if over:
            _undivide_buckets_of(entry.counter_ids)
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


def _undivide_buckets_of(counter_ids: list[int]) -> None:
    """A use beyond its reservation is charged to its own slot, which the other
    slots' quotas do not see: the buckets are divided again (by the next
    calendar reservation, under the budget's lock) before any slot is used.
    Every slot of the buckets is locked in id order, the one lock order."""
    buckets = Q(pk__in=[])
    for row in BudgetCounter.objects.filter(id__in=counter_ids).values(
        "tenant_id", "period", "bucket_start"
    ):
        buckets |= Q(**row)
    ids = list(
        BudgetCounter.objects.select_for_update()
        .filter(buckets)
        .order_by("id")
        .values_list("id", flat=True)
    )
    BudgetCounter.objects.filter(id__in=ids).update(quota_limits=None)


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
