"""The two hand-written statements of the ledger (PostgreSQL, calendar mode).

Kept by the rule of issue 23 (a hand-written statement survives where a
benchmark shows it buys at least 25% of its figure). `bench_budget`, 8 writers
on one tenant, same session (2026-12-03, 2 busy CPUs): the ORM ledger alone
(row locks and `F()` updates) did 51 reserve+settle/s, p99 415 ms, 4% of the
plain single-row update's ops/s; with these two statements 194-260/s, p99
60-103 ms, 13-22% of it. Each statement locks the day and the month counter (in
id order, the ledger's one lock order), checks and writes on the server, so the
rows are held for its own execution only; the ORM holds them across a client
round trip per statement. They run on Django's own cursor, as any query: no
cursor kept aside, nothing prepared, no connection setting changed.

Everything else (rolling windows, grants, a refusal that must name its
dimension, SQLite) goes through the ORM in budgets/ledger.py.
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


def _fits(period: str) -> str:
    """The locked row has room for the amounts under the period's limit as the
    budget row says now (no limit, or no budget: room)."""
    conds = []
    for n in PERIOD_DIMENSIONS:
        limit = f"((SELECT pl FROM lim) -> '{period}' ->> '{n}')"
        amount = f"%(a_{n})s::{_cast(n)}"
        conds.append(
            f"({amount} = 0 OR {limit} IS NULL"
            f" OR used_{n} + reserved_{n} + {amount} <= {limit}::numeric)"
        )
    return " AND ".join(conds)


# Finds and locks the current day and month counters (FOR UPDATE returns them as
# the last writer left them), checks them against the limits, grows both and
# inserts the entry, or does none of it (a missing counter or budget row, or a
# budget no longer in calendar mode: none of it either).
_RESERVE = f"""
WITH lim AS (
    SELECT period_limits AS pl FROM {_BUDGET}
    WHERE id = %(budget)s::bigint AND period_mode = 'calendar'
), locked AS (
    SELECT id, period, used_input_tokens, reserved_input_tokens, used_output_tokens,
           reserved_output_tokens, used_cost, reserved_cost, used_runs, reserved_runs
    FROM {_COUNTER}
    WHERE tenant_id = %(tenant)s::uuid
      AND ((period = 'day' AND bucket_start = %(day)s::timestamptz)
           OR (period = 'month' AND bucket_start = %(month)s::timestamptz))
    ORDER BY id FOR UPDATE
), fits AS (
    SELECT count(*) = 2 AND EXISTS (SELECT 1 FROM lim) AS ok,
           jsonb_agg(id ORDER BY period) AS ids
    FROM locked
    WHERE CASE WHEN period = 'day' THEN {_fits("day")} ELSE {_fits("month")} END
), grown AS (
    UPDATE {_COUNTER} SET {
    ", ".join(
        f"reserved_{n} = reserved_{n} + %(a_{n})s::{_cast(n)}"
        for n in PERIOD_DIMENSIONS
    )
}
    WHERE id IN (SELECT id FROM locked) AND (SELECT ok FROM fits)
    RETURNING 1
)
INSERT INTO {_LEDGER} (id, tenant_id, run_id, step_index, call_id, kind, status,
                       reserved, counter_ids, funding, created_at)
SELECT %(id)s::uuid, %(tenant)s::uuid, %(run)s::uuid, %(step)s::integer,
       %(call)s::text, %(kind)s::text, 'reserved', %(reserved)s::jsonb,
       (SELECT ids FROM fits), '[]'::jsonb, now()
WHERE (SELECT ok FROM fits)
RETURNING counter_ids
"""

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


def reserve(
    *,
    budget_id: int,
    fields: dict[str, Any],
    amounts: Any,
    day: dt.datetime,
    month: dt.datetime,
) -> BudgetLedgerEntry | None:
    """The entry, reserved on the day (`day`) and month (`month`) counters; None
    (and nothing written) if either has no room or is missing."""
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
