"""Eval trials benchmark (issue 27, Numbers): what an eval run adds to a run.

A 20-case suite × k=5 (100 trials) of a scripted shop agent on two real Celery
workers, against 100 plain runs of the same agent with the same inputs on the
same two workers, measured in the same process in nine alternating rounds
(plain first, then eval first, ...) after a warm-up of both. A trial is a
plain run plus what evals add: a fresh shop world made for it (each case sets
up order 4821), the trial row, the after-step hook, grading (a must_call, a
world_state and a final-answer grader) and the eval run's summary. Each side
is timed from the first start to the last run finished (for the eval run: to
its `finished_at`, once every trial was graded and the summary written).

Figures: trials per second and plain runs per second (medians), and the
overhead: the median over rounds of eval time ÷ plain time − 1 (the two sides of
a round run back to back; the box's drift between rounds does not enter).
Target: under 10%. Also how long starting took: plain runs are committed one by
one as they are started, an eval run's worlds, runs and trials in one
transaction (nothing half-started), so its workers begin only after it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.agents import scripted_agent
from bench.bench_steps import postgres_url as fresh_database
from bench.bench_steps import wait_finished
from bench.django_env import BASE_DIR

CASES = 20
K = 5
ROUNDS = 9
WORKERS = 2
DEFAULT_POSTGRES = "postgres://postgres@127.0.0.1:5432/bench_evals"
AGENT = "bench-shop"
ORDER = {
    "order_id": "4821",
    "customer": "Ada Whitfield",
    "item": "Copper kettle, 1.7 l",
    "amount": "89.00",
    "damaged": True,
    "delivered_days_ago": 2,
}
# Two read-only shop calls (no approval: a plain run must not wait for a human),
# then an answer quoting the delivery date.
SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"id": "look", "name": "lookup_order",
                     "arguments": {"order_id": "4821"}}],
     "usage": {"input_tokens": 400, "output_tokens": 30}},
    {"tool_calls": [{"id": "date", "name": "get_delivery_date",
                     "arguments": {"order_id": "4821"}}],
     "usage": {"input_tokens": 500, "output_tokens": 25}},
    {"text": "Sorry about the spout: it arrived on {{date.delivery_date}}.",
     "usage": {"input_tokens": 600, "output_tokens": 20}},
]  # fmt: skip
GRADERS: list[dict[str, Any]] = [
    {"kind": "must_call", "tool": "get_delivery_date", "args": {"order_id": "4821"}},
    {"kind": "world_state", "object": "replacements", "order_id": "4821", "count": 0},
    {"kind": "final_answer_regex", "pattern": "sorry", "ignore_case": True},
]


def inputs() -> list[str]:
    return [
        f"Order #4821 question {i}: when did my kettle arrive?" for i in range(CASES)
    ]


def suite_document(slug: str = "bench", cases: int = CASES) -> dict[str, Any]:
    return {
        "slug": slug,
        "name": slug,
        "cases": [
            {"slug": f"case-{i:02d}", "input": text, "world": {"orders": [ORDER]},
             "graders": GRADERS}
            for i, text in enumerate(inputs()[:cases])
        ],
    }  # fmt: skip


def plain_runs(tenant: Any, user: Any) -> tuple[float, float]:
    """100 plain runs (each input k times) started at once: seconds to the last
    finished, and how long starting them took."""
    from runs.services import run_start

    started = time.time()
    ids = [
        run_start(tenant=tenant, agent_slug=AGENT, input=text, started_by=user).id
        for text in inputs()
        for _ in range(K)
    ]
    begun = time.time() - started
    return wait_finished(ids) - started, begun


def eval_run(tenant: Any, suite: Any, user: Any, k: int = K) -> tuple[float, float]:
    """One eval run of the suite: seconds to its `finished_at`, and how long
    `eval_run_start` took (worlds, runs and trials in one transaction)."""
    from runs.models import EvalRun, EvalTrial
    from runs.services.eval_runs import eval_run_start

    started = time.time()
    run = eval_run_start(tenant=tenant, suite=suite, agent_slug=AGENT, k=k, user=user)
    begun = time.time() - started
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        fresh = EvalRun.objects.get(id=run.id)
        if fresh.status == EvalRun.Status.FINISHED:
            assert fresh.finished_at is not None
            trials = EvalTrial.objects.filter(eval_run=run)
            assert trials.count() == len(suite.cases.all()) * k
            assert not trials.exclude(passed=True).exists(), "a trial failed"
            return float(fresh.finished_at.timestamp()) - started, begun
        time.sleep(0.2)
    raise RuntimeError("the eval run did not finish")


def measure(database_url: str | None) -> dict[str, Any]:
    """In a child process (Django reads its settings once per process)."""
    from bench.django_env import Workers, django_setup

    django_setup(database_url)
    from django.contrib.auth import get_user_model

    from controlplane.services import membership_set, tenant_create
    from runs.demo import demo_seed_shop
    from runs.services.evals import eval_suite_create

    tenant = tenant_create(slug=f"bench-{os.getpid()}", name="Bench")
    demo_seed_shop(tenant=tenant)  # the tenant's real order 4821 (plain runs)
    scripted_agent(
        tenant, AGENT, tools=["lookup_order", "get_delivery_date"], script=SCRIPT
    )
    # Who starts the eval runs (an eval run's scripted approvals act as them).
    user = get_user_model().objects.create_user(username=f"bench-{os.getpid()}")
    membership_set(tenant=tenant, user=user, role="operator")
    suite = eval_suite_create(tenant=tenant, actor=user, document=suite_document())
    small = eval_suite_create(
        tenant=tenant, actor=user, document=suite_document("warm", cases=2)
    )
    figures: dict[str, list[float]] = {
        "plain": [], "eval": [], "plain_start": [], "eval_start": []
    }  # fmt: skip
    with Workers(WORKERS):
        # Not measured: workers just started pay for lazy imports, connections
        # and caches on their first runs, and again on their first trials.
        plain_runs(tenant, user)
        eval_run(tenant, small, user, k=2)
        for index in range(ROUNDS):
            order = ("plain", "eval") if index % 2 == 0 else ("eval", "plain")
            for side in order:
                if side == "plain":
                    total, begun = plain_runs(tenant, user)
                else:
                    total, begun = eval_run(tenant, suite, user)
                figures[side].append(total)
                figures[f"{side}_start"].append(begun)
            plain, evals = figures["plain"][-1], figures["eval"][-1]
            print(f"  round {index + 1}/{ROUNDS}: plain {plain:.2f} s, "
                  f"eval {evals:.2f} s", file=sys.stderr, flush=True)  # fmt: skip
    return figures


def child(database_url: str | None) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    argv = [sys.executable, "-m", "bench.bench_evals", "--child"]
    if database_url:
        argv.append(database_url)
    done = subprocess.run(argv, cwd=BASE_DIR, env=environ, stdout=subprocess.PIPE,
                          text=True, timeout=1800)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child failed (exit {done.returncode})")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def postgres_url() -> str | None:
    """A fresh database (BENCH_POSTGRES_URL, else bench_evals on localhost), or
    None when PostgreSQL is not reachable."""
    os.environ.setdefault("BENCH_POSTGRES_URL", DEFAULT_POSTGRES)
    return fresh_database()


def main() -> None:
    trials = CASES * K
    print(
        f"{CASES} cases × k={K} = {trials} trials on {WORKERS} workers, against "
        f"{trials} plain runs of the same agent and inputs; median of {ROUNDS}"
    )
    print(f"  {'':<12} {'plain runs/s':>13} {'trials/s':>9} "
          f"{'ms/run':>8} {'ms/trial':>9} {'overhead':>9}")  # fmt: skip
    results = {"SQLite": child(None)}
    pg = postgres_url()
    if pg:
        results["PostgreSQL"] = child(pg)
    for db, figures in results.items():
        plain = statistics.median(figures["plain"])
        evals = statistics.median(figures["eval"])
        per_run, per_trial = 1000 * plain / trials, 1000 * evals / trials
        # Each round's two sides ran back to back: their ratio is what the box's
        # drift between rounds does not move.
        paired = [e / p - 1 for p, e in zip(figures["plain"], figures["eval"],
                                             strict=True)]  # fmt: skip
        share = statistics.median(paired)
        verdict = "ok" if share < 0.10 else "MISSED"
        print(
            f"  {db:<12} {trials / plain:>13.1f} {trials / evals:>9.1f} "
            f"{per_run:>8.1f} {per_trial:>9.1f} {share:>+8.1%}  "
            f"(target < 10%: {verdict})"
        )
        starts = (
            1000 * statistics.median(figures["plain_start"]) / trials,
            1000 * statistics.median(figures["eval_start"]) / trials,
        )
        print(
            "    overhead by round: "
            + ", ".join(f"{r:+.1%}" for r in paired)
            + f"; starting: {starts[0]:.1f} ms a run, {starts[1]:.1f} ms a trial"
        )


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        print(json.dumps(measure(sys.argv[2] if len(sys.argv) > 2 else None)))
    else:
        main()
