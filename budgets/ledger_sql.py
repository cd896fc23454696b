"""The two hand-written statements of the ledger (PostgreSQL, calendar mode).

Kept by the rule of issue 23 (a hand-written statement survives where a
benchmark shows it buys at least 25% of its figure). `bench_budget`'s writers
(8 processes on one tenant, the ledger's slots), same session (2026-12-03,
2 CPUs shared with other work, load 5), reserve+settle/s and p99:
both statements 283-301/s, p99 52-54 ms; the reservation through the ORM
instead 42-93/s, p99 178-396 ms; the settlement through the ORM instead
76-119/s, p99 124-200 ms. On a busy machine the ORM's client work per statement
(7 statements for a reservation, 5 for a settlement) is what the writers wait
for. Each statement locks its rows for its own execution only; the reservation
never waits for another writer (SKIP LOCKED). They run on Django's own cursor,
as any query: no cursor kept aside, nothing prepared, no connection setting
changed.

Everything else (dividing the slots, rolling windows, grants, a refusal that
must name its dimension, SQLite) goes through the ORM in budgets/ledger.py.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.db import connection

from budgets.models import PERIOD_DIMENSIONS, Budget, BudgetCounter, BudgetLedgerEntry

_BUDGET = Budget._meta.db_table
_COUNTER = BudgetCounter._meta.db_table
_LEDGER = BudgetLedgerEntry._meta.db_table


def _cast(name: str) -> str:
    return "numeric" if name == "cost" else "bigint"


def _room(period: str) -> str:
    """The slot's quota holds the amounts besides its use (null: no limit)."""
    return " AND ".join(
        f"(%(a_{n})s::{_cast(n)} = 0 OR {period}.quota_{n} IS NULL"
        f" OR {period}.used_{n} + {period}.reserved_{n} + %(a_{n})s::{_cast(n)}"
        f" <= {period}.quota_{n})"
        for n in PERIOD_DIMENSIONS
    )


def _free_slot(period: str) -> str:
    """The first slot of the bucket nobody holds (SKIP LOCKED: never waits)
    with room, divided from the limits the budget has now, locked."""
    return f"""{period} AS MATERIALIZED (
    SELECT {period}.id FROM {_COUNTER} {period}
    WHERE {period}.tenant_id = %(tenant)s::uuid AND {period}.period = '{period}'
      AND {period}.bucket_start = %({period})s::timestamptz
      AND {period}.quota_limits = (SELECT period_limits FROM {_BUDGET}
                                   WHERE id = %(budget)s::bigint
                                     AND period_mode = 'calendar')
      AND {_room(period)}
    ORDER BY {period}.slot LIMIT 1 FOR UPDATE SKIP LOCKED
)"""


# A free slot of the day and of the month with room, both grown and the entry
# inserted; or none of it (no free slot with room in either bucket).
_RESERVE = f"""
WITH {_free_slot("day")}, {_free_slot("month")},
both_free AS (
    SELECT EXISTS (SELECT 1 FROM day) AND EXISTS (SELECT 1 FROM month) AS ok
), grown AS (
    UPDATE {_COUNTER} SET {
    ", ".join(
        f"reserved_{n} = reserved_{n} + %(a_{n})s::{_cast(n)}"
        for n in PERIOD_DIMENSIONS
    )
}
    WHERE id IN (SELECT id FROM day UNION ALL SELECT id FROM month)
      AND (SELECT ok FROM both_free)
    RETURNING 1
)
INSERT INTO {_LEDGER} (id, tenant_id, run_id, step_index, call_id, kind, status,
                       reserved, counter_ids, funding, created_at, expires_at)
SELECT %(id)s::uuid, %(tenant)s::uuid, %(run)s::uuid, %(step)s::integer,
       %(call)s::text, %(kind)s::text, 'reserved', %(reserved)s::jsonb,
       jsonb_build_array((SELECT id FROM day), (SELECT id FROM month)),
       '[]'::jsonb, now(), %(expires)s::timestamptz
WHERE (SELECT ok FROM both_free)
RETURNING counter_ids
"""


def reserve(
    *,
    budget_id: int,
    fields: dict[str, Any],
    amounts: Any,
    day: dt.datetime,
    month: dt.datetime,
) -> BudgetLedgerEntry | None:
    """The entry, reserved on a free slot of the day (`day`) and of the month
    (`month`) bucket; None (and nothing written) if either has none with room."""
    entry = BudgetLedgerEntry(**fields)
    params = {
        "budget": budget_id,
        "id": entry.id,
        "tenant": str(entry.tenant_id),
        "run": str(entry.run_id),
        "step": entry.step_index,
        "call": entry.call_id,
        "kind": entry.kind,
        "reserved": json.dumps(entry.reserved),
        "expires": entry.expires_at,
        "day": day,
        "month": month,
        **_amounts("a", amounts),
    }
    with connection.cursor() as cursor:
        cursor.execute(_RESERVE, params)
        row = cursor.fetchone()
    if row is None:
        return None
    counter_ids = row[0]
    entry.counter_ids = (
        json.loads(counter_ids) if isinstance(counter_ids, str) else counter_ids
    )
    entry._state.adding = False
    return entry


# The ledger row's compare-and-set, then both counters: the use is added always,
# the reservation given back only if this statement won.
_SETTLE = f"""
WITH won AS (
    UPDATE {_LEDGER} SET status = %(status)s::text, actual = %(actual)s::jsonb,
                         settled_at = now()
    WHERE id = %(id)s::uuid AND status = 'reserved' RETURNING 1
), locked AS (
    SELECT id FROM {_COUNTER} WHERE id IN (%(c0)s::bigint, %(c1)s::bigint)
    ORDER BY id FOR UPDATE
), moved AS (
    UPDATE {_COUNTER} SET {
    ", ".join(
        f"used_{n} = used_{n} + %(u_{n})s::{_cast(n)}, reserved_{n} = reserved_{n}"
        f" - CASE WHEN EXISTS (SELECT 1 FROM won) THEN %(r_{n})s::{_cast(n)} ELSE 0 END"
        for n in PERIOD_DIMENSIONS
    )
}
    WHERE id IN (SELECT id FROM locked) RETURNING 1
)
SELECT (SELECT count(*) FROM won), (SELECT count(*) FROM moved)
"""


def _amounts(prefix: str, amounts: Any) -> dict[str, Any]:
    return {f"{prefix}_{n}": amounts.get(n) for n in PERIOD_DIMENSIONS}


def settle(
    *, entry: BudgetLedgerEntry, actual: Any, reserved: Any, status: str
) -> bool:
    """Settle or release `entry` (no grants in its funding); whether it won."""
    c0, c1 = entry.counter_ids
    params = {
        "id": entry.id,
        "status": status,
        "actual": None if status == "released" else json.dumps(actual.to_dict()),
        "c0": c0,
        "c1": c1,
        **_amounts("u", actual),
        **_amounts("r", reserved),
    }
    with connection.cursor() as cursor:
        cursor.execute(_SETTLE, params)
        row = cursor.fetchone()
    return bool(row and row[0])
