"""The budget ledger: reserve before spending, settle after, release the rest.

Enforcement is atomic, and no interleaving of writers overspends a limit.

Calendar mode (escrow). Each period bucket (the UTC day, the UTC month) is split
into `slot_count()` counter rows; each slot holds a share of the limit in its
`quota_*` columns, and the shares always add up to the limit. A writer reserves
on its own slot (by process id) with one conditional statement, `UPDATE ... SET
reserved = reserved + x WHERE used + reserved + x <= quota`, for the day and the
month slot together with the ledger insert, autocommitted: concurrent writers
mostly touch different rows. When a slot runs short, the locked path takes every
slot of the bucket (day before month, by slot: one lock order everywhere), checks
the whole bucket against the limit read under those locks, and re-divides what is
left between the slots. A slot's quota may lie below its use (a lowered limit);
it then refuses until the locked path is taken.

Rolling mode. The budget row is locked (`SELECT ... FOR UPDATE`), the window's
buckets are summed and checked, and the current buckets grow, in one transaction
with the ledger row. On PostgreSQL that transaction is two statements sent in
one round trip (a pipeline): the lock, then the sums, the checks against the
limits read under the lock, the counter updates and the ledger insert as one
statement, whose snapshot is taken once the lock is held. The lock is then held
for the server's work alone, not for a client's round trips; a refusal (or a
budget edited meanwhile) takes the ORM path, which names the dimension.

Grants. A run's approved extension of a period limit is its own row
(`BudgetGrant`): once the tenant's limit refuses the run, the granted dimension
is reserved from the grant instead of the counters (the entry's `funding`), so
the period's total stays within the limit plus the grants.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal
from typing import Any

import psycopg
import psycopg.errors
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q, Sum, Value
from django.utils import timezone
from psycopg.types.numeric import Int4, Int8

from budgets.models import (
    PERIOD_DIMENSIONS,
    PERIODS,
    Budget,
    BudgetCounter,
    BudgetGrant,
    BudgetLedgerEntry,
)
from controlplane.models import Tenant
from controlplane.rows import Select, instances_select

ROLLING_WINDOWS = {"day": dt.timedelta(hours=24), "month": dt.timedelta(days=30)}
# Slots per calendar bucket on PostgreSQL; SQLite serialises writers anyway.
POSTGRES_SLOTS = 16
_MICRO = Decimal("0.000001")


def slot_count() -> int:
    return POSTGRES_SLOTS if connection.vendor == "postgresql" else 1


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
    """A reservation that would cross a limit; `dimension` is the exact one.

    For a period limit, `period` and `name` say which; `limit` is what the run
    was held to (the tenant's limit, or its own grant), `total` what was used or
    reserved against it and `wanted` what the reservation needed. `needed` is
    the least extension (of the run's grant) that would let it through.
    """

    dimension: str  # e.g. "tenant_cost_per_day"
    detail: str
    period: str = ""
    name: str = ""
    limit: Decimal = Decimal(0)
    total: Decimal = Decimal(0)
    wanted: Decimal = Decimal(0)
    needed: Decimal = Decimal(0)


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
        return Q(period=period, bucket_start__gte=_window_oldest(mode, period, now))
    return Q(period=period, bucket_start=bucket_start(mode, period, now))


def _window_oldest(mode: str, period: str, now: dt.datetime) -> dt.datetime:
    """The start of the oldest bucket in `period`'s rolling window at `now`."""
    return bucket_start(mode, period, now - ROLLING_WINDOWS[period])


def _limits_from(period_limits: dict[str, Any] | None, period: str) -> dict[str, Any]:
    """The period's limits as numbers (int for counts, Decimal for cost)."""
    raw = (period_limits or {}).get(period) or {}
    return {
        name: Decimal(str(value)) if name == "cost" else int(value)
        for name, value in raw.items()
        if value is not None
    }


class _Stale(Exception):
    """A cached slot row is gone (or some are missing): look the bucket up again."""


# ---------------------------------------------------------------- slots

_SLOT_IDS: dict[tuple[Any, str, dt.datetime, int], list[int]] = {}


def _bucket_ids(
    tenant_id: Any, period: str, start: dt.datetime, slots: int
) -> list[int]:
    """The bucket's counter ids by slot, created (with their quotas) if missing."""
    key = (tenant_id, period, start, slots)
    found = _SLOT_IDS.get(key)
    if found is not None:
        return found
    ids = list(
        BudgetCounter.objects.filter(
            tenant_id=tenant_id, period=period, bucket_start=start, slot__lt=slots
        )
        .order_by("slot")
        .values_list("id", flat=True)
    )
    if len(ids) < slots:
        ids = _bucket_create(tenant_id, period, start, slots)
    if len(_SLOT_IDS) > 10_000:
        _SLOT_IDS.clear()
    _SLOT_IDS[key] = ids
    return ids


def _bucket_create(
    tenant_id: Any, period: str, start: dt.datetime, slots: int
) -> list[int]:
    # Under the budget row lock, as budget_update: the quotas are computed from
    # the limits as they are, and a concurrent edit waits for them (or the
    # other way round) instead of leaving stale shares.
    with transaction.atomic():
        budget = Budget.objects.select_for_update().filter(tenant_id=tenant_id).first()
        BudgetCounter.objects.bulk_create(
            [
                BudgetCounter(
                    tenant_id=tenant_id, period=period, bucket_start=start, slot=slot
                )
                for slot in range(slots)
            ],
            ignore_conflicts=True,
        )
        rows = list(
            BudgetCounter.objects.select_for_update()
            .filter(
                tenant_id=tenant_id, period=period, bucket_start=start, slot__lt=slots
            )
            .order_by("slot")
        )
        if budget is not None and budget.period_mode == Budget.PeriodMode.CALENDAR:
            _rebalance(rows, _limits_from(budget.period_limits, period), budget.version)
    return [row.id for row in rows]


def _rebalance(
    rows: list[BudgetCounter],
    limits: dict[str, Any],
    version: int,
    favoured: int = 0,
    changed: tuple[str, ...] = (),
) -> None:
    """Divide what is left of each limit between the slots (saved with `changed`).

    Each slot gets its use plus an equal share of `limit - total` (negative when
    the bucket is over a lowered limit), the remainder to slot `favoured`; the
    quotas then add up to the limit exactly.
    """
    count = len(rows)
    for name in PERIOD_DIMENSIONS:
        limit = limits.get(name)
        for row in rows:
            setattr(row, f"quota_{name}", None)
        if limit is None:
            continue
        current = [
            getattr(row, f"used_{name}") + getattr(row, f"reserved_{name}")
            for row in rows
        ]
        room = limit - sum(current)
        share: Any = (
            (Decimal(room) / count).quantize(_MICRO, rounding=ROUND_FLOOR)
            if name == "cost"
            else int(room) // count
        )
        rest = room - share * count
        for row, used in zip(rows, current, strict=True):
            extra = rest if row.slot == favoured else 0
            setattr(row, f"quota_{name}", used + share + extra)
    for row in rows:
        row.limits_version = version
    fields = [f"quota_{name}" for name in PERIOD_DIMENSIONS]
    BudgetCounter.objects.bulk_update(rows, [*fields, "limits_version", *changed])


def budget_slots_sync(*, budget: Budget, now: dt.datetime | None = None) -> None:
    """Re-divide the current calendar buckets after a limit changed (call in the
    transaction that saves the budget, holding its row lock)."""
    if budget.period_mode != Budget.PeriodMode.CALENDAR:
        return
    now = now or timezone.now()
    slots = slot_count()
    for period in PERIODS:
        start = bucket_start(budget.period_mode, period, now)
        rows = list(
            BudgetCounter.objects.select_for_update()
            .filter(
                tenant_id=budget.tenant_id,
                period=period,
                bucket_start=start,
                slot__lt=slots,
            )
            .order_by("slot")
        )
        if len(rows) == slots:  # a bucket not made yet gets its quotas when made
            _rebalance(rows, _limits_from(budget.period_limits, period), budget.version)


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


def budget_grant_add(
    *,
    tenant_id: Any,
    run_id: Any,
    period: str,
    bucket_start: dt.datetime,
    dimension: str,
    amount: Decimal,
) -> BudgetGrant:
    """Extend the run's grant on one period dimension of one bucket by `amount`."""
    with transaction.atomic():
        grant, created = BudgetGrant.objects.select_for_update().get_or_create(
            run_id=run_id,
            period=period,
            bucket_start=bucket_start,
            dimension=dimension,
            defaults={"tenant_id": tenant_id, "amount": amount},
        )
        if not created:
            BudgetGrant.objects.filter(id=grant.id).update(amount=F("amount") + amount)
            grant.refresh_from_db()
    return grant


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
    for _attempt in range(3):
        try:
            if budget.period_mode == Budget.PeriodMode.ROLLING:
                if connection.vendor == "postgresql" and not funding:
                    entry = _reserve_rolling_fast(budget, amounts, fields, now)
                    if entry is not None:
                        return entry
                return _reserve_rolling(budget, amounts, fields, now, funding)
            return _reserve_calendar(budget, amounts, fields, now, funding)
        except _Stale:
            _SLOT_IDS.clear()  # a bucket went away (or was never complete)
    raise RuntimeError("budget counters keep changing under this reservation")


def _reserve_calendar(
    budget: Budget,
    amounts: Amounts,
    fields: dict[str, Any],
    now: dt.datetime,
    funding: list[dict[str, Any]],
) -> BudgetLedgerEntry | BudgetRefusal:
    slots = slot_count()
    mine = os.getpid() % slots
    ids = {
        period: _bucket_ids(
            budget.tenant_id, period, bucket_start(budget.period_mode, period, now),
            slots,
        )
        for period in PERIODS
    }  # fmt: skip
    if slots > 1 and not funding:
        entry = _reserve_fast(budget, amounts, fields, [ids[p][mine] for p in PERIODS])
        if entry is not None:
            return entry
    return _reserve_locked(budget, amounts, fields, ids, mine, funding)


# c0 (the day) is read first, so it is updated first, then c1 (the month).
_RESERVE_SQL = """
WITH {ctes}
INSERT INTO {ledger} (id, tenant_id, run_id, step_index, call_id, kind, status,
                      reserved, counter_ids, funding, created_at)
SELECT %(id)s::uuid, %(tenant)s::uuid, %(run)s::uuid, %(step)s::integer,
       %(call)s::text, %(kind)s::text, 'reserved', %(reserved)s::jsonb,
       %(counters)s::jsonb, '[]'::jsonb, now()
WHERE CASE WHEN EXISTS (SELECT 1 FROM c0) AND EXISTS (SELECT 1 FROM c1) THEN true
           WHEN EXISTS (SELECT 1 FROM c0) OR EXISTS (SELECT 1 FROM c1)
           THEN 1 / (SELECT count(*) * 0 FROM c0) = 1
           ELSE false END
"""
_RESERVE_CTE = (
    "c{i} AS (UPDATE {counter} SET {sets} WHERE id = %(c{i})s::bigint"
    " AND limits_version = %(version)s::integer AND {conds} RETURNING 1)"
)


def _param(prefix: str, name: str) -> str:
    """A typed amount parameter (one prepared statement whatever the values)."""
    return f"%({prefix}_{name})s::{'numeric' if name == 'cost' else 'bigint'}"


def _reserve_statement() -> str:
    sets = ", ".join(
        f"reserved_{n} = reserved_{n} + {_param('a', n)}" for n in PERIOD_DIMENSIONS
    )
    conds = " AND ".join(
        f"({_param('a', n)} = 0 OR quota_{n} IS NULL"
        f" OR used_{n} + reserved_{n} + {_param('a', n)} <= quota_{n})"
        for n in PERIOD_DIMENSIONS
    )
    counter = BudgetCounter._meta.db_table
    ctes = ", ".join(
        _RESERVE_CTE.format(i=i, counter=counter, sets=sets, conds=conds)
        for i in range(len(PERIODS))
    )
    return _RESERVE_SQL.format(ctes=ctes, ledger=BudgetLedgerEntry._meta.db_table)


_RESERVE = _reserve_statement()


def _raw_cursor() -> psycopg.Cursor[Any]:
    """A server-side-binding cursor on Django's own connection (same transaction
    state), so the fixed statements below can be prepared once per connection.

    Django turns prepared statements off on its connections (its own cursors
    bind on the client and never prepare); an explicit `prepare=True` needs a
    threshold, set high so nothing else is ever prepared automatically. The
    cursor is kept with the connection and used again (one per connection).
    """
    connection.ensure_connection()
    raw = connection.connection
    kept: psycopg.Cursor[Any] | None = getattr(connection, "_budget_cursor", None)
    if kept is not None and kept.connection is raw and not kept.closed:
        return kept
    if settings.BUDGET_PREPARED_STATEMENTS and raw.prepare_threshold is None:
        raw.prepare_threshold = 2**31 - 1
    cursor = psycopg.Cursor(raw)
    connection._budget_cursor = cursor  # type: ignore[attr-defined]
    return cursor


def _prepare() -> bool:
    return bool(settings.BUDGET_PREPARED_STATEMENTS)


def _typed(amounts: Amounts, prefix: str) -> dict[str, Any]:
    """The amounts as parameters of fixed types: psycopg would send a Python int
    as int2, int4 or int8 by its size, and each mix is another prepared statement."""
    return {
        f"{prefix}_input_tokens": Int8(amounts.input_tokens),
        f"{prefix}_output_tokens": Int8(amounts.output_tokens),
        f"{prefix}_cost": Decimal(amounts.cost),
        f"{prefix}_runs": Int8(amounts.runs),
    }


def _entry_params(
    entry: BudgetLedgerEntry, fields: dict[str, Any], amounts: Amounts
) -> dict[str, Any]:
    """The parameters of the ledger insert and of the two counter updates."""
    run_id = fields["run_id"]
    step = fields["step_index"]
    counter_ids = entry.counter_ids
    return {
        "id": entry.id,
        "tenant": fields["tenant_id"],
        "run": run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id)),
        "step": None if step is None else Int4(step),
        "call": str(fields["call_id"]),
        "kind": str(fields["kind"]),
        "reserved": json.dumps(fields["reserved"]),
        "counters": f"[{counter_ids[0]}, {counter_ids[1]}]",
        "c0": Int8(counter_ids[0]),
        "c1": Int8(counter_ids[1]),
        **_typed(amounts, "a"),
    }


def _reserve_fast(
    budget: Budget, amounts: Amounts, fields: dict[str, Any], counter_ids: list[int]
) -> BudgetLedgerEntry | None:
    """One statement on the writer's own slots; None if a slot is short (or its
    quotas are from another budget version): the locked path decides then."""
    entry = BudgetLedgerEntry(counter_ids=counter_ids, **fields)
    params = {**_entry_params(entry, fields, amounts), "version": Int4(budget.version)}

    def run() -> bool:
        cursor = _raw_cursor()
        cursor.execute(_RESERVE, params, prepare=_prepare())
        return cursor.rowcount == 1

    try:
        if connection.in_atomic_block:  # a savepoint the refusal rolls back to
            with transaction.atomic():
                inserted = run()
        else:  # one statement, autocommitted
            inserted = run()
    except psycopg.errors.DivisionByZero:
        # One period granted and the other not: the statement undid itself.
        inserted = False
    if not inserted:
        return None
    entry._state.adding = False
    return entry


def _reserve_locked(
    budget: Budget,
    amounts: Amounts,
    fields: dict[str, Any],
    ids: dict[str, list[int]],
    mine: int,
    funding: list[dict[str, Any]],
) -> BudgetLedgerEntry | BudgetRefusal:
    """Every slot of both buckets locked: check the buckets against the limits
    read now, reserve on this writer's slots and re-divide the rest."""
    wanted_ids = [counter_id for p in PERIODS for counter_id in ids[p]]
    with transaction.atomic():
        rows = list(
            BudgetCounter.objects.select_for_update()
            .filter(id__in=wanted_ids)
            .order_by("period", "slot")  # day before month, then by slot
        )
        if len(rows) != len(wanted_ids):
            raise _Stale
        fresh = (
            Budget.objects.filter(tenant_id=budget.tenant_id)
            .values_list("period_limits", "version")
            .first()
        )
        period_limits, version = fresh if fresh is not None else ({}, 0)
        by_period = {p: [r for r in rows if r.period == p] for p in PERIODS}
        for period in PERIODS:
            refusal = _over_limit(
                period, _limits_from(period_limits, period),
                _totals(by_period[period]), amounts, _excluded(funding, period),
            )  # fmt: skip
            if refusal is not None:
                return refusal
        refused = _charge_grants(funding, amounts)
        if refused is not None:
            transaction.set_rollback(True)
            return refused
        changed: list[str] = []
        for period in PERIODS:
            excluded = _excluded(funding, period)
            row = by_period[period][mine]
            for name in PERIOD_DIMENSIONS:
                if name not in excluded and amounts.get(name):
                    field = f"reserved_{name}"
                    setattr(row, field, getattr(row, field) + amounts.get(name))
                    if field not in changed:
                        changed.append(field)
            _rebalance(
                by_period[period], _limits_from(period_limits, period), version,
                favoured=mine, changed=tuple(changed),
            )  # fmt: skip
        return BudgetLedgerEntry.objects.create(
            counter_ids=[by_period[p][mine].id for p in PERIODS],
            funding=funding,
            **fields,
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


def _reserve_rolling(
    budget: Budget,
    amounts: Amounts,
    fields: dict[str, Any],
    now: dt.datetime,
    funding: list[dict[str, Any]],
) -> BudgetLedgerEntry | BudgetRefusal:
    ids = dict(zip(PERIODS, _rolling_counter_ids(budget, now), strict=True))
    mode = budget.period_mode
    with transaction.atomic():
        locked = (
            Budget.objects.select_for_update()
            .filter(id=budget.id)
            .values_list("period_limits", flat=True)
            .first()
        )
        for period in PERIODS:
            limits = _limits_from(locked, period)
            if not limits:
                continue
            totals = window_totals(budget.tenant_id, mode, period, now)
            refusal = _over_limit(
                period, limits, totals, amounts, _excluded(funding, period)
            )
            if refusal is not None:
                return refusal
        refused = _charge_grants(funding, amounts)
        if refused is not None:
            transaction.set_rollback(True)
            return refused
        for period in PERIODS:
            excluded = _excluded(funding, period)
            increments = {
                f"reserved_{name}": F(f"reserved_{name}") + Value(amounts.get(name))
                for name in PERIOD_DIMENSIONS
                if amounts.get(name) and name not in excluded
            }
            if increments and not (
                BudgetCounter.objects.filter(id=ids[period]).update(**increments)
            ):
                transaction.set_rollback(True)
                raise _Stale
        return BudgetLedgerEntry.objects.create(
            counter_ids=[ids[p] for p in PERIODS], funding=funding, **fields
        )


# The window sums of the budget's tenant, taken by a statement that starts once
# the budget row is locked: every reservation before it is counted.
_ROLLING_CTES = """
lim AS (SELECT period_limits AS pl FROM {budget}
        WHERE id = %(budget)s::bigint AND period_mode = 'rolling'),
{windows},
{updates}
"""


def _reserve_rolling_statement() -> str:
    counter = BudgetCounter._meta.db_table
    windows = ",\n".join(
        f"w{i} AS (SELECT "
        + ", ".join(
            f"coalesce(sum(used_{n} + reserved_{n}), 0) AS {n}"
            for n in PERIOD_DIMENSIONS
        )
        + f" FROM {counter} WHERE tenant_id = %(tenant)s::uuid"
        f" AND period = '{period}' AND bucket_start >= %(oldest{i})s::timestamptz)"
        for i, period in enumerate(PERIODS)
    )
    sets = ", ".join(
        f"reserved_{n} = reserved_{n} + {_param('a', n)}" for n in PERIOD_DIMENSIONS
    )

    def conds(i: int, period: str) -> str:
        return " AND ".join(
            f"({_param('a', n)} = 0"
            f" OR (SELECT pl FROM lim) -> '{period}' ->> '{n}' IS NULL"
            f" OR (SELECT {n} FROM w{i}) + {_param('a', n)}"
            f" <= ((SELECT pl FROM lim) -> '{period}' ->> '{n}')::numeric)"
            for n in PERIOD_DIMENSIONS
        )

    updates = ",\n".join(
        f"c{i} AS (UPDATE {counter} SET {sets} WHERE id = %(c{i})s::bigint"
        f" AND EXISTS (SELECT 1 FROM lim) AND {conds(i, period)} RETURNING 1)"
        for i, period in enumerate(PERIODS)
    )
    ctes = _ROLLING_CTES.format(
        budget=Budget._meta.db_table, windows=windows, updates=updates
    )
    return _RESERVE_SQL.format(ctes=ctes, ledger=BudgetLedgerEntry._meta.db_table)


_RESERVE_ROLLING = _reserve_rolling_statement()
_LOCK_BUDGET = (
    f"SELECT 1 FROM {Budget._meta.db_table} WHERE id = %(budget)s::bigint FOR UPDATE"
)


def _reserve_rolling_fast(
    budget: Budget, amounts: Amounts, fields: dict[str, Any], now: dt.datetime
) -> BudgetLedgerEntry | None:
    """The budget row lock and one statement that checks the windows and reserves,
    in one round trip; None if a limit refuses (the ORM path then says which)."""
    entry = BudgetLedgerEntry(counter_ids=_rolling_counter_ids(budget, now), **fields)
    params = {
        **_entry_params(entry, fields, amounts),
        "budget": Int8(budget.id),
        **{
            f"oldest{i}": _window_oldest(budget.period_mode, p, now)
            for i, p in enumerate(PERIODS)
        },
    }
    lock = {"budget": params["budget"]}
    cursor = _raw_cursor()
    try:
        if connection.in_atomic_block:  # a savepoint the refusal rolls back to
            transact: Any = transaction.atomic()
            batch: Any = nullcontext()
        else:  # one round trip where libpq can pipeline (14+), two otherwise
            raw = connection.connection
            transact = raw.transaction()
            batch = raw.pipeline() if psycopg.Pipeline.is_supported() else nullcontext()
        with batch, transact:
            cursor.execute(_LOCK_BUDGET, lock, prepare=_prepare())
            cursor.execute(_RESERVE_ROLLING, params, prepare=_prepare())
        inserted = cursor.rowcount == 1
    except psycopg.errors.DivisionByZero:
        inserted = False  # one period had room and the other not: undone
    if not inserted:
        return None
    entry._state.adding = False
    return entry


def _rolling_counter_ids(budget: Budget, now: dt.datetime) -> list[int]:
    """The current day and month buckets' counters (one slot each)."""
    mode = budget.period_mode
    return [
        _bucket_ids(budget.tenant_id, p, bucket_start(mode, p, now), 1)[0]
        for p in PERIODS
    ]


# ---------------------------------------------------------------- settle


# The select list runs the updates in this order: the ledger row, then the day,
# then the month (the reservation's order). Data-modifying CTEs left unread run
# last, later ones first, which would be month before day: a deadlock with a
# reservation holding the day row.
_SETTLE_SQL = """
WITH l AS (UPDATE {ledger} SET status = %(status)s::text, actual = %(actual)s::jsonb,
                  settled_at = now()
           WHERE id = %(id)s::uuid AND status = 'reserved' RETURNING 1),
     {ctes}
SELECT (SELECT count(*) FROM l), {counts}
"""


def _settle_statement() -> str:
    sets = ", ".join(
        f"used_{n} = used_{n} + {_param('u', n)}, reserved_{n} = reserved_{n}"
        f" - CASE WHEN EXISTS (SELECT 1 FROM l) THEN {_param('r', n)} ELSE 0 END"
        for n in PERIOD_DIMENSIONS
    )
    counter = BudgetCounter._meta.db_table
    ctes = ", ".join(
        f"c{i} AS (UPDATE {counter} SET {sets} WHERE id = %(c{i})s::bigint RETURNING 1)"
        for i in range(len(PERIODS))
    )
    counts = ", ".join(f"(SELECT count(*) FROM c{i})" for i in range(len(PERIODS)))
    return _SETTLE_SQL.format(
        ledger=BudgetLedgerEntry._meta.db_table, ctes=ctes, counts=counts
    )


_SETTLE = _settle_statement()


def _settle_fast(entry: BudgetLedgerEntry, actual: Amounts, status: str) -> bool:
    """One statement: the ledger compare-and-set and both counter updates."""
    params: dict[str, Any] = {
        "id": entry.id,
        "status": str(status),
        "actual": None if status == "released" else json.dumps(actual.to_dict()),
        "c0": Int8(entry.counter_ids[0]),
        "c1": Int8(entry.counter_ids[1]),
        **_typed(actual, "u"),
        **_typed(Amounts.from_dict(entry.reserved), "r"),
    }
    cursor = _raw_cursor()
    cursor.execute(_SETTLE, params, prepare=_prepare())
    row = cursor.fetchone()
    return bool(row and row[0])


def _settle_locked(entry: BudgetLedgerEntry, actual: Amounts, status: str) -> bool:
    """The same in a transaction: SQLite, and entries funded by grants."""
    reserved = Amounts.from_dict(entry.reserved)
    funding = list(entry.funding or [])
    with transaction.atomic():
        won = BudgetLedgerEntry.objects.filter(
            id=entry.id, status=BudgetLedgerEntry.Status.RESERVED
        ).update(
            status=status,
            actual=None if status == "released" else actual.to_dict(),
            settled_at=timezone.now(),
        )
        for period, counter_id in zip(PERIODS, entry.counter_ids, strict=False):
            excluded = _excluded(funding, period)
            changes: dict[str, Any] = {}
            for name in PERIOD_DIMENSIONS:
                if name in excluded:
                    continue
                delta = actual.get(name)
                if delta:
                    changes[f"used_{name}"] = F(f"used_{name}") + Value(delta)
                if won and reserved.get(name):
                    changes[f"reserved_{name}"] = F(f"reserved_{name}") - Value(
                        reserved.get(name)
                    )
            if changes:
                BudgetCounter.objects.filter(id=counter_id).update(**changes)
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


def _fast(entry: BudgetLedgerEntry) -> bool:
    return (
        connection.vendor == "postgresql"
        and not entry.funding
        and len(entry.counter_ids) == len(PERIODS)
    )


def budget_settle(entry: BudgetLedgerEntry, actual: Amounts) -> bool:
    """Move the reservation to used with the actual amounts (never refused: the
    spend happened). A reservation already released by recovery only adds its use.
    Returns whether this call settled the reservation itself."""
    status = BudgetLedgerEntry.Status.SETTLED
    if _fast(entry):
        settled = _settle_fast(entry, actual, status)
    else:
        settled = _settle_locked(entry, actual, status)
    if not settled:  # released before: keep what was spent on the entry too
        BudgetLedgerEntry.objects.filter(id=entry.id).update(
            actual=actual.to_dict(), settled_at=timezone.now()
        )
    entry.status = status
    entry.actual = actual.to_dict()
    return settled


def budget_release(entry: BudgetLedgerEntry) -> bool:
    """Give a reservation back without use; a no-op once settled or released."""
    status = BudgetLedgerEntry.Status.RELEASED
    if _fast(entry):
        return _settle_fast(entry, Amounts(), status)
    return _settle_locked(entry, Amounts(), status)


def budget_release_for_run(*, run_id: Any) -> int:
    """Release every open reservation of a run (its step crashed or it ended)."""
    released = 0
    for entry in BudgetLedgerEntry.objects.filter(
        run_id=run_id, status=BudgetLedgerEntry.Status.RESERVED
    ):
        released += budget_release(entry)
    return released


# ---------------------------------------------------------------- reads


def counter_totals(counter: BudgetCounter) -> dict[str, Decimal]:
    return {
        name: Decimal(getattr(counter, f"used_{name}"))
        + Decimal(getattr(counter, f"reserved_{name}"))
        for name in PERIOD_DIMENSIONS
    }


def window_totals(
    tenant_id: Any, mode: str, period: str, now: dt.datetime
) -> dict[str, Decimal]:
    """Used + reserved per dimension over the period's window, against the
    tenant's limit (what runs reserved from their own grants is not in it)."""
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
    """Used and reserved per dimension in the window, grants included."""
    sums = BudgetCounter.objects.filter(
        window_filter(mode, period, now), tenant_id=tenant_id
    ).aggregate(
        **{
            f"{state}_{name}": Sum(f"{state}_{name}")
            for name in PERIOD_DIMENSIONS
            for state in ("used", "reserved")
        }
    )
    granted = (
        BudgetGrant.objects.filter(
            window_filter(mode, period, now), tenant_id=tenant_id
        )
        .values("dimension")
        .annotate(used=Sum("used"), reserved=Sum("reserved"))
    )
    extra = {row["dimension"]: row for row in granted}
    usage: dict[str, dict[str, str]] = {}
    for name in PERIOD_DIMENSIONS:
        usage[name] = {}
        for state in ("used", "reserved"):
            counted = sums[f"{state}_{name}"] or 0
            granted_here = extra.get(name, {}).get(state)
            if granted_here:
                total = Decimal(str(counted)) + granted_here
                counted = total.quantize(_MICRO) if name == "cost" else int(total)
            usage[name][state] = str(counted)
    return usage


def budget_of(tenant: Tenant | Any) -> Budget | None:
    found = budget_select(tenant).run()
    return found[0] if found else None


def budget_select(tenant: Tenant | Any) -> Select:
    """`budget_of`'s query, to run with others: the budget, or nothing."""
    tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
    return instances_select(Budget, {"tenant": tenant_id}, limit=1)
