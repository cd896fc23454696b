"""The budget ledger: reserve before spending, settle after, release the rest.

Enforcement is atomic. In calendar mode each period has one counter row and a
reservation is a conditional `UPDATE ... SET reserved = reserved + x WHERE id = ?
AND used + reserved + x <= limit` (refused when no row matches); in rolling mode
the tenant's budget row is locked (`SELECT ... FOR UPDATE`) while the window's
buckets are summed and the current bucket grows. Either way the ledger row and the
counters change in one transaction, so concurrent workers never overspend.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg.errors
from django.db import DataError, IntegrityError, connection, transaction
from django.db.models import F, Q, Sum, Value
from django.db.models.lookups import LessThanOrEqual
from django.utils import timezone

from controlplane.budget_models import (
    PERIOD_DIMENSIONS,
    PERIODS,
    Budget,
    BudgetCounter,
    BudgetLedgerEntry,
)
from controlplane.models import Tenant

ROLLING_WINDOWS = {"day": dt.timedelta(hours=24), "month": dt.timedelta(days=30)}


@dataclass(frozen=True)
class Amounts:
    """What a reservation holds or a settlement spent, per period dimension."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)
    runs: int = 0

    def get(self, dimension: str) -> Any:
        return getattr(self, dimension)

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost": str(self.cost),
            "runs": self.runs,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Amounts:
        data = data or {}
        return cls(
            input_tokens=int(data.get("input_tokens", 0)),
            output_tokens=int(data.get("output_tokens", 0)),
            cost=Decimal(str(data.get("cost", "0"))),
            runs=int(data.get("runs", 0)),
        )


@dataclass(frozen=True)
class BudgetRefusal:
    """A reservation that would cross a limit; `dimension` is the exact one."""

    dimension: str  # e.g. "tenant_cost_per_day"
    detail: str


def refusal_dimension(dimension: str, period: str) -> str:
    return f"tenant_{dimension}_per_{period}"


def bucket_start(mode: str, period: str, now: dt.datetime) -> dt.datetime:
    now = now.astimezone(dt.UTC)
    if mode == Budget.PeriodMode.ROLLING:
        if period == "day":
            return now.replace(minute=0, second=0, microsecond=0)
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def window_filter(mode: str, period: str, now: dt.datetime) -> Q:
    """The buckets that count for `period` at `now` (conservative at the edges)."""
    if mode == Budget.PeriodMode.ROLLING:
        oldest = bucket_start(mode, period, now - ROLLING_WINDOWS[period])
        return Q(period=period, bucket_start__gte=oldest)
    return Q(period=period, bucket_start=bucket_start(mode, period, now))


def _limits_of(budget: Budget, period: str) -> dict[str, Decimal]:
    raw = (budget.period_limits or {}).get(period) or {}
    return {
        name: Decimal(str(value)) for name, value in raw.items() if value is not None
    }


def _counter_for(tenant_id: Any, period: str, start: dt.datetime) -> BudgetCounter:
    counter = BudgetCounter.objects.filter(
        tenant_id=tenant_id, period=period, bucket_start=start
    ).first()
    if counter is not None:
        return counter
    try:
        with transaction.atomic():
            return BudgetCounter.objects.create(
                tenant_id=tenant_id, period=period, bucket_start=start
            )
    except IntegrityError:  # another worker created it first
        return BudgetCounter.objects.get(
            tenant_id=tenant_id, period=period, bucket_start=start
        )


class _Refused(Exception):
    def __init__(self, refusal: BudgetRefusal) -> None:
        super().__init__(refusal.dimension)
        self.refusal = refusal


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
    """Reserve `amounts` against every period limit, or refuse and change nothing."""
    now = now or timezone.now()
    mode = budget.period_mode
    # Outside the critical section: find or create the current buckets.
    ids = {
        period: _counter_id(budget.tenant_id, period, bucket_start(mode, period, now))
        for period in PERIODS
    }
    fields = {
        "tenant_id": budget.tenant_id,
        "run_id": run_id,
        "step_index": step_index,
        "call_id": call_id,
        "kind": kind,
        "reserved": amounts.to_dict(),
        "counter_ids": [ids[period] for period in PERIODS],
    }
    fast = connection.vendor == "postgresql" and mode == Budget.PeriodMode.CALENDAR
    if fast and any(amounts.get(name) for name in PERIOD_DIMENSIONS):
        try:
            if not connection.in_atomic_block:  # one statement, autocommitted
                return _reserve_calendar_postgres(budget, ids, amounts, fields)
            with transaction.atomic():  # a savepoint the refusal rolls back to
                return _reserve_calendar_postgres(budget, ids, amounts, fields)
        except _Refused:
            pass  # named below, from the counters as they are now
    else:
        try:
            with transaction.atomic():
                entry = BudgetLedgerEntry.objects.create(**fields)
                if mode == Budget.PeriodMode.ROLLING:
                    _reserve_rolling(budget, ids, amounts, now)
                else:
                    _reserve_calendar(budget, ids, amounts)
                return entry
        except _Refused as refused:
            if refused.refusal.dimension:
                return refused.refusal
    # Refused without a name (the fast path, or a bucket gone): rolled back by now.
    counters = list(BudgetCounter.objects.filter(id__in=ids.values()))
    if len(counters) < len(PERIODS):  # a cached bucket went away: look again
        _COUNTER_IDS.clear()
        return budget_reserve(
            budget=budget, run_id=run_id, kind=kind, amounts=amounts,
            step_index=step_index, call_id=call_id, now=now,
        )  # fmt: skip
    by_id = {counter.id: counter for counter in counters}
    for period in PERIODS:
        limits = _limits_of(budget, period)
        totals = counter_totals(by_id[ids[period]])
        if any(
            name in limits and amounts.get(name) > 0
            and totals[name] + amounts.get(name) > limits[name]
            for name in PERIOD_DIMENSIONS
        ):  # fmt: skip
            return _which(totals, limits, amounts, period)
    limited = [p for p in PERIODS if _limits_of(budget, p)]
    return _which(
        counter_totals(by_id[ids[limited[0]]]), _limits_of(budget, limited[0]),
        amounts, limited[0],
    )  # fmt: skip


_COUNTER_IDS: dict[tuple[Any, str, dt.datetime], int] = {}


def _counter_id(tenant_id: Any, period: str, start: dt.datetime) -> int:
    key = (tenant_id, period, start)
    found = _COUNTER_IDS.get(key)
    if found is None:
        if len(_COUNTER_IDS) > 10_000:
            _COUNTER_IDS.clear()
        found = _COUNTER_IDS[key] = _counter_for(tenant_id, period, start).id
    return found


_COUNTER_TABLE = BudgetCounter._meta.db_table
_LEDGER_TABLE = BudgetLedgerEntry._meta.db_table


def _reserve_calendar_postgres(
    budget: Budget, ids: dict[str, int], amounts: Amounts, fields: dict[str, Any]
) -> BudgetLedgerEntry:
    """One statement: both conditional counter updates and the ledger insert.

    The insert happens only if both updates matched; otherwise the caller's
    transaction rolls back the one that did. Each writer then holds the hot rows
    for one statement and its commit (the CTEs run day first, then month).
    """
    params: dict[str, Any] = {}
    ctes = []
    for period in PERIODS:
        limits = _limits_of(budget, period)
        params[f"{period}_id"] = ids[period]
        sets, conds = [], []
        for name in PERIOD_DIMENSIONS:
            if not amounts.get(name):
                continue
            params[f"a_{name}"] = amounts.get(name)
            sets.append(f"reserved_{name} = reserved_{name} + %(a_{name})s")
            if name in limits and amounts.get(name) > 0:
                params[f"{period}_{name}_limit"] = limits[name]
                conds.append(
                    f"used_{name} + reserved_{name} + %(a_{name})s"
                    f" <= %({period}_{name}_limit)s"
                )
        where = " AND ".join([f"id = %({period}_id)s", *conds])
        ctes.append(
            f"{period}_upd AS (UPDATE {_COUNTER_TABLE} SET {', '.join(sets)}"
            f" WHERE {where} RETURNING id)"
        )
    entry = BudgetLedgerEntry(**fields)
    params.update(
        id=entry.id,
        tenant=fields["tenant_id"],
        run=uuid.UUID(str(fields["run_id"])),
        step=fields["step_index"],
        call=fields["call_id"],
        kind=fields["kind"],
        reserved=json.dumps(fields["reserved"]),
        counters=json.dumps(fields["counter_ids"]),
    )
    both = " AND ".join(f"EXISTS (SELECT 1 FROM {p}_upd)" for p in PERIODS)
    either = " OR ".join(f"EXISTS (SELECT 1 FROM {p}_upd)" for p in PERIODS)
    # One period granted and the other refused: divide by zero on purpose, so the
    # whole statement (the granted update too) is undone; SQL has no RAISE. The
    # zero comes from a subquery so the planner cannot fold it into every plan.
    sql = (
        f"WITH {', '.join(ctes)} INSERT INTO {_LEDGER_TABLE} (id, tenant_id, run_id,"
        " step_index, call_id, kind, status, reserved, counter_ids, created_at)"
        " SELECT %(id)s, %(tenant)s, %(run)s, %(step)s, %(call)s, %(kind)s,"
        " 'reserved', %(reserved)s::jsonb, %(counters)s::jsonb, now()"
        f" WHERE CASE WHEN {both} THEN true"
        f" WHEN {either} THEN 1 / (SELECT count(*) * 0 FROM {PERIODS[0]}_upd) = 1"
        " ELSE false END"
    )
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            inserted = cursor.rowcount == 1
    except DataError as exc:
        if not isinstance(exc.__cause__, psycopg.errors.DivisionByZero):
            raise
        inserted = False
    if not inserted:
        raise _Refused(BudgetRefusal("", ""))  # named from the counters
    entry._state.adding = False
    return entry


def _settle_postgres(entry: BudgetLedgerEntry, actual: Amounts, status: str) -> bool:
    """One statement: the ledger compare-and-set and both counter updates."""
    reserved = Amounts.from_dict(entry.reserved)
    params: dict[str, Any] = {
        "id": entry.id,
        "status": status,
        "actual": None if status == "released" else json.dumps(actual.to_dict()),
    }
    sets = []
    for name in PERIOD_DIMENSIONS:
        if actual.get(name):
            params[f"u_{name}"] = actual.get(name)
            sets.append(f"used_{name} = used_{name} + %(u_{name})s")
        if reserved.get(name):
            params[f"r_{name}"] = reserved.get(name)
            sets.append(
                f"reserved_{name} = reserved_{name} - CASE WHEN EXISTS"
                f" (SELECT 1 FROM l) THEN %(r_{name})s ELSE 0 END"
            )
    ctes = [
        f"l AS (UPDATE {_LEDGER_TABLE} SET status = %(status)s,"
        " actual = %(actual)s::jsonb, settled_at = now()"
        " WHERE id = %(id)s AND status = 'reserved' RETURNING 1)"
    ]
    selects = ["(SELECT count(*) FROM l)"]
    if sets:
        for index, counter_id in enumerate(entry.counter_ids):
            params[f"c{index}"] = counter_id
            ctes.append(
                f"c{index} AS (UPDATE {_COUNTER_TABLE} SET {', '.join(sets)}"
                f" WHERE id = %(c{index})s RETURNING 1)"
            )
            selects.append(f"(SELECT count(*) FROM c{index})")
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {', '.join(ctes)} SELECT {', '.join(selects)}", params)
        row = cursor.fetchone()
    return bool(row and row[0])


def _reserve_calendar(budget: Budget, ids: dict[str, int], amounts: Amounts) -> None:
    for period in PERIODS:  # always day before month: one lock order everywhere
        limits = _limits_of(budget, period)
        conditions: list[Any] = [
            LessThanOrEqual(
                F(f"used_{name}") + F(f"reserved_{name}") + Value(amounts.get(name)),
                Value(limits[name]),
            )
            for name in PERIOD_DIMENSIONS
            if name in limits and amounts.get(name) > 0
        ]
        increments = _increments("reserved", amounts)
        if not increments:
            continue
        updated = BudgetCounter.objects.filter(*conditions, id=ids[period]).update(
            **increments
        )
        if not updated:
            counter = BudgetCounter.objects.filter(id=ids[period]).first()
            if counter is None:  # a cached bucket went away
                raise _Refused(BudgetRefusal("", ""))
            raise _Refused(_which(counter_totals(counter), limits, amounts, period))


def _reserve_rolling(
    budget: Budget, ids: dict[str, int], amounts: Amounts, now: dt.datetime
) -> None:
    Budget.objects.select_for_update().filter(id=budget.id).values_list("id").get()
    for period in PERIODS:
        limits = _limits_of(budget, period)
        if not limits:
            continue
        totals = window_totals(budget.tenant_id, budget.period_mode, period, now)
        for name in PERIOD_DIMENSIONS:
            over = totals[name] + amounts.get(name) > limits.get(name, totals[name])
            if name in limits and amounts.get(name) > 0 and over:
                raise _Refused(_which(totals, limits, amounts, period))
    increments = _increments("reserved", amounts)
    for period in PERIODS:
        if increments and not (
            BudgetCounter.objects.filter(id=ids[period]).update(**increments)
        ):
            raise _Refused(BudgetRefusal("", ""))  # a cached bucket went away


def _which(
    totals: dict[str, Decimal],
    limits: dict[str, Decimal],
    amounts: Amounts,
    period: str,
) -> BudgetRefusal:
    for name in PERIOD_DIMENSIONS:
        wanted = amounts.get(name)
        if name in limits and wanted > 0 and totals[name] + wanted > limits[name]:
            return BudgetRefusal(
                refusal_dimension(name, period),
                f"the tenant's {name} limit per {period} is {limits[name]}; "
                f"{totals[name]} is used or reserved and this needs {wanted}",
            )
    # Raced with a settlement in between; the limit was still what refused it.
    name = next(n for n in PERIOD_DIMENSIONS if n in limits and amounts.get(n) > 0)
    return BudgetRefusal(
        refusal_dimension(name, period),
        f"the tenant's {name} limit per {period} is {limits[name]}",
    )


def counter_totals(counter: BudgetCounter) -> dict[str, Decimal]:
    return {
        name: Decimal(getattr(counter, f"used_{name}"))
        + Decimal(getattr(counter, f"reserved_{name}"))
        for name in PERIOD_DIMENSIONS
    }


def window_totals(
    tenant_id: Any, mode: str, period: str, now: dt.datetime
) -> dict[str, Decimal]:
    """Used + reserved per dimension over the period's window."""
    sums = BudgetCounter.objects.filter(
        window_filter(mode, period, now), tenant_id=tenant_id
    ).aggregate(
        **{
            name: Sum(F(f"used_{name}") + F(f"reserved_{name}"))
            for name in PERIOD_DIMENSIONS
        }
    )
    return {name: Decimal(str(sums[name] or 0)) for name in PERIOD_DIMENSIONS}


def window_usage(
    tenant_id: Any, mode: str, period: str, now: dt.datetime
) -> dict[str, dict[str, str]]:
    sums = BudgetCounter.objects.filter(
        window_filter(mode, period, now), tenant_id=tenant_id
    ).aggregate(
        **{
            f"{state}_{name}": Sum(f"{state}_{name}")
            for name in PERIOD_DIMENSIONS
            for state in ("used", "reserved")
        }
    )
    return {
        name: {
            "used": str(sums[f"used_{name}"] or 0),
            "reserved": str(sums[f"reserved_{name}"] or 0),
        }
        for name in PERIOD_DIMENSIONS
    }


def _increments(state: str, amounts: Amounts, sign: int = 1) -> dict[str, Any]:
    return {
        f"{state}_{name}": F(f"{state}_{name}") + Value(sign * amounts.get(name))
        for name in PERIOD_DIMENSIONS
        if amounts.get(name)
    }


def budget_settle(entry: BudgetLedgerEntry, actual: Amounts) -> bool:
    """Move the reservation to used with the actual amounts (never refused: the
    spend happened). A reservation already released by recovery only adds its use.
    Returns whether this call settled the reservation itself."""
    if connection.vendor == "postgresql":
        settled = _settle_postgres(entry, actual, BudgetLedgerEntry.Status.SETTLED)
        if not settled:
            BudgetLedgerEntry.objects.filter(id=entry.id).update(
                actual=actual.to_dict(), settled_at=timezone.now()
            )
        entry.status = BudgetLedgerEntry.Status.SETTLED
        entry.actual = actual.to_dict()
        return settled
    with transaction.atomic():
        won = BudgetLedgerEntry.objects.filter(
            id=entry.id, status=BudgetLedgerEntry.Status.RESERVED
        ).update(
            status=BudgetLedgerEntry.Status.SETTLED,
            actual=actual.to_dict(),
            settled_at=timezone.now(),
        )
        reserved = Amounts.from_dict(entry.reserved)
        for counter_id in entry.counter_ids:
            changes = _increments("used", actual)
            if won:
                for name, value in _increments("reserved", reserved, -1).items():
                    changes[name] = value
            if changes:
                BudgetCounter.objects.filter(id=counter_id).update(**changes)
        if not won:
            BudgetLedgerEntry.objects.filter(id=entry.id).update(
                actual=actual.to_dict(), settled_at=timezone.now()
            )
    entry.status = BudgetLedgerEntry.Status.SETTLED
    entry.actual = actual.to_dict()
    return bool(won)


def budget_release(entry: BudgetLedgerEntry) -> bool:
    """Give a reservation back without use; a no-op once settled or released."""
    if connection.vendor == "postgresql":
        return _settle_postgres(entry, Amounts(), BudgetLedgerEntry.Status.RELEASED)
    with transaction.atomic():
        won = BudgetLedgerEntry.objects.filter(
            id=entry.id, status=BudgetLedgerEntry.Status.RESERVED
        ).update(status=BudgetLedgerEntry.Status.RELEASED, settled_at=timezone.now())
        if won:
            reserved = Amounts.from_dict(entry.reserved)
            changes = _increments("reserved", reserved, -1)
            for counter_id in entry.counter_ids:  # day, then month: one lock order
                if changes:
                    BudgetCounter.objects.filter(id=counter_id).update(**changes)
    return bool(won)


def budget_release_for_run(*, run_id: Any) -> int:
    """Release every open reservation of a run (its step crashed or it ended)."""
    released = 0
    for entry in BudgetLedgerEntry.objects.filter(
        run_id=run_id, status=BudgetLedgerEntry.Status.RESERVED
    ):
        released += budget_release(entry)
    return released


def budget_of(tenant: Tenant | Any) -> Budget | None:
    tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
    return Budget.objects.filter(tenant_id=tenant_id).first()
