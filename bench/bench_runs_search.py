"""Runs list search benchmark (issue 29 item 9): `GET /api/v1/runs/?q=` as the
list's selector serves it (the first page of 50 and the count), over one tenant
of RUNS runs (another tenant holds as many more), for a rare word (1 run in
1,000), a common word (1 in 3) and two words, next to the unfiltered list.

On PostgreSQL the search is measured with the trigram indexes of migration
runs/0014 and, in the same run, with them dropped (the baseline: a sequential
scan of the tenant's rows), then they are made again. SQLite has no such index:
its figure is the scan.

    python -m bench bench_runs_search            # SQLite, 100,000 runs
    BENCH_DATABASE_URL=postgres://… python -m bench bench_runs_search
    python -m bench.bench_runs_search --short    # 20,000 runs
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.django_env import django_setup, percentile

REPEATS = 15
WORDS = [
    "kettle",
    "lid",
    "order",
    "parcel",
    "refund",
    "replace",
    "broken",
    "warranty",
    "invoice",
    "customer",
    "delivery",
    "store",
    "return",
    "label",
    "carrier",
    "damaged",
    "spout",
    "handle",
    "base",
    "filter",
    "cable",
    "plug",
    "switch",
    "light",
    "water",
    "boil",
    "steam",
    "scale",
    "descale",
    "glass",
    "steel",
    "plastic",
]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _seed(count: int) -> Any:
    from decimal import Decimal

    from controlplane.services import tenant_create
    from runs.models import Agent, Run
    from tests.agents import make_agent

    rng = random.Random(29)
    tenants = [tenant_create(slug=f"bench-{i}", name=f"Bench {i}") for i in (1, 2)]
    for tenant in tenants:
        agent: Agent = make_agent(tenant, "bench")
        batch: list[Run] = []
        for i in range(count):
            rare = " zanzibar" if i % 1000 == 7 else ""
            common = " teapot" if i % 3 == 0 else ""
            batch.append(
                Run(
                    tenant=tenant,
                    agent=agent,
                    agent_version=agent.current_version,
                    input=_text(rng, 40) + rare + common,
                    final_answer=_text(rng, 60),
                    status=Run.Status.SUCCEEDED,
                    cost=Decimal(rng.randint(0, 500)) / 100,
                )
            )
            if len(batch) == 5000:
                Run.objects.bulk_create(batch)
                batch = []
        Run.objects.bulk_create(batch)
    return tenants[0]


def _timed(read: Callable[[], Any]) -> tuple[float, Any]:
    samples = []
    result = None
    for _ in range(REPEATS):
        started = time.perf_counter()
        result = read()
        samples.append((time.perf_counter() - started) * 1000)
    return percentile(samples, 50), result


def _page(tenant: Any, text: str) -> Callable[[], tuple[int, int]]:
    from runs.selectors import RunListQuery, run_list_for

    def read() -> tuple[int, int]:
        runs = run_list_for(tenant=tenant, query=RunListQuery(text=text))
        return runs.count(), len(list(runs[:50]))

    return read


def _trigram_indexes(present: bool) -> None:
    from django.db import connection

    from runs.search_indexes import RUN_SEARCH_INDEXES

    with connection.cursor() as cursor:
        for name, create in RUN_SEARCH_INDEXES.items():
            cursor.execute(create if present else f"DROP INDEX IF EXISTS {name}")
        cursor.execute("ANALYZE runs_run")


def main() -> None:
    count = 20_000 if "--short" in sys.argv else 100_000
    url = django_setup(os.environ.get("BENCH_DATABASE_URL"))
    from django.db import connection

    print(f"database: {connection.vendor}; {count:,} runs per tenant, 2 tenants")
    started = time.monotonic()
    tenant = _seed(count)
    print(f"seeded in {time.monotonic() - started:.1f} s")
    queries = {
        "no search (baseline)": "",
        "rare word (1 in 1,000)": "zanzibar",
        "common word (1 in 3)": "teapot",
        "two words": "zanzibar teapot",
    }
    modes = ["trigram indexes", "no index (scan)"]
    if connection.vendor != "postgresql":
        modes = ["no index (scan)"]
    print("\n| query | " + " | ".join(f"p50, {m}" for m in modes) + " | rows / shown |")
    print("|---|" + "---|" * (len(modes) + 1))
    figures: dict[str, list[str]] = {name: [] for name in queries}
    shown: dict[str, Any] = {}
    for mode in modes:
        if connection.vendor == "postgresql":
            _trigram_indexes(present=mode == "trigram indexes")
        for name, text in queries.items():
            p50, result = _timed(_page(tenant, text))
            figures[name].append(f"{p50:.1f} ms")
            shown[name] = result
    if connection.vendor == "postgresql":
        _trigram_indexes(present=True)
    for name in queries:
        count_, page = shown[name]
        print(f"| {name} | " + " | ".join(figures[name]) + f" | {count_:,} / {page} |")
    print(f"\n(database {url.split('@')[-1]})")


if __name__ == "__main__":
    main()
