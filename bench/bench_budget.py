"""Budget benchmark (issue 8): reserve+settle under 8 concurrent writers.

On PostgreSQL (BENCH_POSTGRES_URL; the database is created afresh), in one child
process, side by side for the same duration and the same 8 writer processes (each
with its own connection, all on one tenant, so they contend for the same rows):

  * a plain single-row update (`UPDATE ... SET n = n + 1 WHERE id = %s`, one hot
    row, autocommit) on a Django cursor: the floor for "one hot row";
  * the same update through the Django ORM (`filter().update(F() + 1)`), for
    reference: the ORM costs more per statement than the driver;
  * reserve + settle in calendar mode (the ledger: the budget row locked with
    `select_for_update`, the window's counters read and checked, the current
    buckets grown by `F()` updates and the ledger row inserted; the settlement
    a compare-and-set on the ledger row and `F()` updates of the counters);
  * the same in rolling mode (the same code; the window is many buckets);
  * a race for a limit that fits exactly 50 reservations: every writer reserves
    until the time is up, and no more than the limit may be granted.

Plain and calendar rounds alternate, so a change in machine load hits both alike.

Targets (issue 23): no overspend under 8 writers, p99 of reserve+settle ≤ 20 ms.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from decimal import Decimal
from typing import Any

from bench.django_env import BASE_DIR, percentile

WRITERS = 8
SECONDS = 3.0
ROUNDS = 3
DEFAULT_POSTGRES = "postgres://postgres@127.0.0.1:5432/bench_budget"


def hammer(operation: Any, writers: int = WRITERS) -> dict[str, Any]:
    """Run `operation` in `writers` processes for SECONDS; ops/s, latency in ms.

    Processes, not threads: real workers are processes, and threads would measure
    the GIL (a row lock held while its holder waits for the interpreter)."""
    import multiprocessing

    from django.db import connections

    # Each forked writer opens its own connection. The pool goes too: a child
    # forked beside the pool's threads inherits their locks held and hangs.
    connections.close_all()
    for connection in connections.all():
        if hasattr(connection, "close_pool"):
            connection.close_pool()
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(writers + 1)
    results = context.Queue()

    def writer() -> None:
        operation()  # warm the connection outside the measurement
        barrier.wait()
        deadline = time.perf_counter() + SECONDS
        mine: list[float] = []
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            operation()
            mine.append(time.perf_counter() - started)
        connections.close_all()
        results.put(mine)

    processes = [context.Process(target=writer) for _ in range(writers)]
    for process in processes:
        process.start()
    barrier.wait()
    started = time.perf_counter()
    latencies = [results.get(timeout=SECONDS + 60) for _ in processes]
    elapsed = time.perf_counter() - started
    for process in processes:
        process.join()
    ms = [value * 1000 for per in latencies for value in per]
    return {
        "ops_per_s": len(ms) / elapsed,
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "ops": len(ms),
        "latencies_ms": ms,
    }


def merged(runs: list[dict[str, Any]]) -> dict[str, float]:
    latencies = [value for run in runs for value in run["latencies_ms"]]
    return {
        "ops_per_s": sum(run["ops_per_s"] for run in runs) / len(runs),
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "ops": len(latencies),
    }


def measure(database_url: str) -> dict[str, Any]:
    from bench.django_env import django_setup

    load_start = os.getloadavg()[0]
    django_setup(database_url)
    import uuid

    from django.db import connection
    from django.db.models import F

    from budgets.ledger import budget_reserve, budget_settle
    from budgets.models import Budget, BudgetCounter, BudgetLedgerEntry
    from budgets.periods import Amounts
    from controlplane.models import Tenant

    tenant = Tenant.objects.create(slug=f"bench-{uuid.uuid4().hex[:6]}", name="b")
    plain_tenant = Tenant.objects.create(slug=f"plain-{uuid.uuid4().hex[:6]}", name="p")
    hot = BudgetCounter.objects.create(
        tenant=plain_tenant, period="day", bucket_start="2026-01-01T00:00Z"
    )
    limits = {
        period: {"input_tokens": 10**15, "output_tokens": 10**15, "cost": "1e12"}
        for period in ("day", "month")
    }
    budget = Budget.objects.create(tenant=tenant, period_limits=limits)
    amounts = Amounts(input_tokens=1200, output_tokens=1024, cost=Decimal("0.0132"))
    actual = Amounts(input_tokens=1100, output_tokens=300, cost=Decimal("0.0058"))
    run_id = uuid.uuid4()

    plain_sql = (
        f"UPDATE {BudgetCounter._meta.db_table} SET used_runs = used_runs + 1"
        " WHERE id = %s"
    )

    def plain_update() -> None:
        with connection.cursor() as cursor:  # autocommitted
            cursor.execute(plain_sql, [hot.id])

    def plain_orm() -> None:
        BudgetCounter.objects.filter(id=hot.id).update(used_runs=F("used_runs") + 1)

    def reserve_and_settle() -> None:
        entry = budget_reserve(
            budget=budget, run_id=run_id, kind="model_call", amounts=amounts
        )
        assert isinstance(entry, BudgetLedgerEntry), entry
        budget_settle(entry, actual)

    # Alternate plain and calendar rounds so a change in machine load hits both.
    rounds: dict[str, list[dict[str, float]]] = {
        "plain": [], "calendar": [], "plain_orm": [],
    }  # fmt: skip
    for _ in range(ROUNDS):
        rounds["plain"].append(hammer(plain_update))
        rounds["calendar"].append(hammer(reserve_and_settle))
        rounds["plain_orm"].append(hammer(plain_orm))
    figures: dict[str, Any] = {key: merged(runs) for key, runs in rounds.items()}
    # One writer: the latency floor on this machine, without contention.
    figures["plain_1"] = hammer(plain_update, writers=1)
    figures["calendar_1"] = hammer(reserve_and_settle, writers=1)
    budget.period_mode = Budget.PeriodMode.ROLLING
    budget.save()
    figures["rolling"] = hammer(reserve_and_settle)
    # Nothing lost or double counted: every settled reservation is in the counters.
    settled = BudgetLedgerEntry.objects.filter(tenant=tenant, status="settled").count()
    day = BudgetCounter.objects.filter(tenant=tenant, period="day")
    used = sum(c.used_input_tokens for c in day)
    reserved = sum(c.reserved_input_tokens for c in day)
    figures["consistent"] = used == settled * actual.input_tokens and reserved == 0
    figures["race"] = race(Tenant, Budget, BudgetLedgerEntry, BudgetCounter)
    for key in ("rolling", "plain_1", "calendar_1"):
        figures[key].pop("latencies_ms")
    figures["load_start"] = load_start
    return figures


RACE_FITS = 50


def race(tenant_model: Any, budget_model: Any, entry_model: Any, counter: Any) -> Any:
    """8 writers reserve $0.01 each against a day limit of $0.50 until the time
    is up: no more than 50 may be granted, nor reserved beyond the limit."""
    import uuid

    from budgets.ledger import budget_reserve
    from budgets.periods import Amounts

    tenant = tenant_model.objects.create(slug=f"race-{uuid.uuid4().hex[:6]}", name="r")
    limit = Decimal("0.01") * RACE_FITS
    budget = budget_model.objects.create(
        tenant=tenant, period_limits={"day": {"cost": str(limit)}}
    )
    run_id = uuid.uuid4()

    def reserve() -> None:
        budget_reserve(
            budget=budget, run_id=run_id, kind="model_call",
            amounts=Amounts(cost=Decimal("0.01")),
        )  # fmt: skip

    attempts = hammer(reserve)["ops"] + WRITERS  # each writer's warm-up reserves too
    granted = entry_model.objects.filter(tenant=tenant).count()
    reserved = sum(
        c.reserved_cost for c in counter.objects.filter(tenant=tenant, period="day")
    )
    return {
        "attempts": attempts,
        "granted": granted,
        "fits": RACE_FITS,
        "reserved": str(reserved),
        "limit": str(limit),
        "no_overspend": granted <= RACE_FITS and reserved <= limit,
    }


def postgres_url() -> str | None:
    url = os.environ.get("BENCH_POSTGRES_URL", DEFAULT_POSTGRES)
    try:
        import psycopg

        admin = url.rsplit("/", 1)[0] + "/postgres"
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(admin, autocommit=True, connect_timeout=2) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
    except Exception as exc:  # noqa: BLE001 - report and stop
        print(f"  (PostgreSQL unreachable, nothing measured: {exc})")
        return None
    return url


def child(database_url: str) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    argv = [sys.executable, "-m", "bench.bench_budget", "--child", database_url]
    done = subprocess.run(argv, cwd=BASE_DIR, env=environ, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    url = postgres_url()
    if url is None:
        return
    figures = child(url)
    print(
        f"PostgreSQL, {WRITERS} concurrent writer processes on one tenant; plain and"
        f" calendar alternate {ROUNDS} x {SECONDS:.0f} s, rolling {SECONDS:.0f} s"
    )
    load = os.getloadavg()[0]
    print(
        f"  (load average: {figures['load_start']:.1f} at the start,"
        f" {load:.1f} at the end, on {os.cpu_count()} CPUs)"
    )
    print(f"  {'':<40} {'ops/s':>9} {'p50 ms':>9} {'p99 ms':>9}")
    names = {
        "plain": "plain single-row update (baseline)",
        "plain_orm": "plain update through the ORM",
        "calendar": "reserve + settle, calendar periods",
        "rolling": "reserve + settle, rolling windows",
        "plain_1": "plain update, 1 writer",
        "calendar_1": "reserve + settle (calendar), 1 writer",
    }
    for key, name in names.items():
        f = figures[key]
        print(
            f"  {name:<40} {f['ops_per_s']:>9.0f} {f['p50_ms']:>9.2f}"
            f" {f['p99_ms']:>9.2f}"
        )
    plain = figures["plain"]["ops_per_s"]
    print(
        f"  the plain update's own p99 with {WRITERS} writers:"
        f" {figures['plain']['p99_ms']:.1f} ms"
        f" (1 writer: {figures['plain_1']['p99_ms']:.1f} ms)"
    )
    for key in ("calendar", "rolling"):
        f = figures[key]
        ratio = f["ops_per_s"] / plain
        p99 = "ok" if f["p99_ms"] <= 20 else "MISSED"
        print(f"  {key}: p99 ≤ 20 ms: {p99}; {ratio:.0%} of the plain update's ops/s")
    print(f"  counters match the settled ledger: {figures['consistent']}")
    race = figures["race"]
    verdict = "ok" if race["no_overspend"] else "OVERSPENT"
    print(
        f"  race of {WRITERS} writers for a limit that fits {race['fits']}:"
        f" {race['granted']} granted of {race['attempts']} attempts, reserved"
        f" {race['reserved']} of {race['limit']}: no overspend: {verdict}"
    )


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        print(json.dumps(measure(sys.argv[2])))
    else:
        main()
