"""Step benchmark (issue 3): control-plane overhead per step and worker scaling.

Measured in one run, side by side:
  * the engine loop in process, no persistence (the floor);
  * LangGraph running an equivalent 50-node scripted agent on its SQLite checkpointer;
  * our control plane: a 50-step scripted run with a no-op tool on one real Celery
    worker, on SQLite and on PostgreSQL (BENCH_POSTGRES_URL, when reachable);
  * throughput of 20 concurrent 25-step runs on one worker and on two, next to
    how much more CPU-bound work two processes do than one on this box.

Per-step overhead is the time between consecutive model calls: with a scripted
model and a no-op tool, everything in between is the control plane.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.agents import scripted_agent
from bench.django_env import BASE_DIR, percentile

STEPS = 50
CONCURRENT_RUNS = 20
CONCURRENT_STEPS = 25  # long enough that starting the runs weighs little
ROUNDS = 5
DEFAULT_POSTGRES = "postgres://postgres@127.0.0.1:5432/bench_controlplane"


def echo_script(steps: int) -> list[dict[str, Any]]:
    calls = [
        {"tool_calls": [{"id": f"c{i}", "name": "echo", "arguments": {"text": f"{i}"}}],
         "usage": {"input_tokens": 100, "output_tokens": 10}}
        for i in range(steps - 1)
    ]  # fmt: skip
    return [
        *calls,
        {"text": "done", "usage": {"input_tokens": 100, "output_tokens": 5}},
    ]


def intervals(stamps: list[float]) -> list[float]:
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


def summary(intervals_s: list[float], total_s: float, steps: int) -> dict[str, float]:
    ms = [i * 1000 for i in intervals_s]
    return {
        "steps_per_s": steps / total_s,
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
    }


def in_process() -> dict[str, float]:
    from runs.engine.adapters.scripted import ScriptedModel
    from runs.engine.budget import BudgetLimits
    from runs.engine.contracts import Effect, ToolContract, ToolSource
    from runs.engine.loop import AgentConfig, run_in_process
    from runs.engine.tools import Tool, ToolRegistry

    stamps: list[float] = []

    class TimedModel(ScriptedModel):
        def complete(self, messages: Any, tools: Any, max_output_tokens: int) -> Any:
            stamps.append(time.perf_counter())
            return super().complete(messages, tools, max_output_tokens)

    contract = ToolContract(
        name="echo",
        description="echo",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        effect=Effect.READ_ONLY,
        source=ToolSource.BUILTIN,
    )
    registry = ToolRegistry([Tool(contract, lambda a, c: {"text": a["text"]},
                                  timeout_seconds=None)])  # fmt: skip
    started = time.perf_counter()
    result = run_in_process(
        AgentConfig(name="bench"),
        TimedModel(echo_script(STEPS)),
        registry,
        user_input="go",
        limits=BudgetLimits(max_steps=STEPS + 5),
    )
    total = time.perf_counter() - started
    assert str(result.stop_reason) == "done", result.stop_reason
    return summary(intervals(stamps), total, STEPS)


def langgraph() -> dict[str, float]:
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
    except ImportError:
        return {"error": "langgraph not installed (pip install -e '.[bench]')"}  # type: ignore[dict-item]
    from typing import TypedDict

    class State(TypedDict):
        messages: list[dict[str, Any]]

    stamps: list[float] = []
    script = echo_script(STEPS)

    def node(index: int) -> Any:
        def step(state: State) -> dict[str, Any]:
            stamps.append(time.perf_counter())
            reply = script[index]  # the scripted "model"
            messages = [*state["messages"], {"role": "assistant", **reply}]
            for call in reply.get("tool_calls", []):  # the no-op tool
                messages.append({"role": "tool", "content": call["arguments"]["text"]})
            return {"messages": messages}

        return step

    graph = StateGraph(State)
    for index in range(STEPS):
        graph.add_node(f"n{index}", node(index))
        graph.add_edge(START if index == 0 else f"n{index - 1}", f"n{index}")
    graph.add_edge(f"n{STEPS - 1}", END)
    path = os.path.join(tempfile.mkdtemp(prefix="cp-bench-lg-"), "checkpoints.sqlite")
    with SqliteSaver.from_conn_string(path) as saver:
        app = graph.compile(checkpointer=saver)
        started = time.perf_counter()
        app.invoke(
            {"messages": [{"role": "user", "content": "go"}]},
            {"configurable": {"thread_id": "bench"}, "recursion_limit": STEPS + 10},
        )
        total = time.perf_counter() - started
    return summary(intervals(stamps), total, STEPS)


def control_plane(database_url: str | None) -> dict[str, Any]:
    """Runs in a child process: Django reads its settings once per process.

    One worker and two workers stay up side by side, each on a queue of its
    own (the idle ones wait in a blocking pop, taking no CPU). ROUNDS rounds
    measure one then the other, in alternating order, so that a box whose speed
    drifts during the run weighs on both sides of the ratio alike."""
    from bench.django_env import Workers, django_setup

    django_setup(database_url)
    from controlplane.celery import app
    from controlplane.services import tenant_create

    tenant = tenant_create(slug=f"bench-{os.getpid()}", name="Bench")
    for slug, steps in (("long", STEPS), ("short", CONCURRENT_STEPS)):
        scripted_agent(
            tenant, slug, tools=["echo"], script=echo_script(steps),
            default_limits={"max_steps": steps + 5, "max_tool_calls": steps + 5},
        )  # fmt: skip

    db = "PostgreSQL" if database_url else "SQLite"
    gaps: list[float] = []
    single_seconds = 0.0
    measured: dict[int, list[float]] = {1: [], 2: []}
    box: list[float] = []
    base = app.conf.task_default_queue
    with Workers(1, queue=f"{base}-1") as one, Workers(2, queue=f"{base}-2") as two:
        queues = {1: one.queue, 2: two.queue}
        for count, queue in queues.items():
            app.conf.task_default_queue = queue  # where this process starts runs
            warm_up(tenant, count)
        for index in range(ROUNDS):
            for position, count in enumerate((1, 2) if index % 2 == 0 else (2, 1)):
                app.conf.task_default_queue = queues[count]
                if count == 1:
                    round_gaps, seconds = single_run(tenant)
                    gaps += round_gaps
                    single_seconds += seconds
                measured[count].append(throughput(tenant))
                if position == 0:  # between the two, in the same state of the box
                    box.append(box_scaling())
            print(f"  {db} round {index + 1}/{ROUNDS}: 1 worker "
                  f"{measured[1][-1]:.1f} steps/s, 2 workers "
                  f"{measured[2][-1]:.1f} steps/s (box: 2 processes "
                  f"{box[-1]:.2f}x 1)", file=sys.stderr, flush=True)  # fmt: skip
    return {
        "single": summary(gaps, single_seconds, STEPS * ROUNDS),
        "one_worker": measured[1],
        "two_workers": measured[2],
        "box_scaling": box,
    }


def warm_up(tenant: Any, workers: int) -> None:
    """A few short runs on workers just started, not measured: a worker's first
    steps pay for lazy imports, connections and caches that a long-lived worker
    paid for long ago."""
    short_runs(tenant, 2 * workers)


def short_runs(tenant: Any, count: int) -> float:
    """Start `count` short runs at once; when the last of them finished."""
    from runs.services import run_start

    return wait_finished([
        run_start(tenant=tenant, agent_slug="short", input="go", started_by=None).id
        for _ in range(count)
    ])  # fmt: skip


def wait_finished(ids: list[Any]) -> float:
    """When the last of the runs finished (its own timestamp: the poll is slow so
    that this process takes little CPU from the workers)."""
    from django.db.models import Max

    from runs.models import Run

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        runs = Run.objects.filter(id__in=ids)
        if not runs.exclude(status__in=[s.value for s in Run.TERMINAL]).exists():
            last = runs.aggregate(last=Max("finished_at"))["last"]
            return float(last.timestamp())
        time.sleep(0.2)
    raise RuntimeError("runs did not finish")


def single_run(tenant: Any) -> tuple[list[float], float]:
    """One 50-step run: the gaps between its model calls, and its duration."""
    from runs.models import Run
    from runs.services import run_start

    started = time.time()
    run = run_start(tenant=tenant, agent_slug="long", input="go", started_by=None)
    finished = wait_finished([run.id])
    run = Run.objects.get(id=run.id)
    assert run.status == "unverified", (run.status, run.stop_reason, run.stop_detail)
    stamps = [s.started_at.timestamp() for s in run.step_rows.order_by("index")]
    return intervals(stamps), finished - started


def throughput(tenant: Any) -> float:
    started = time.time()
    finished = short_runs(tenant, CONCURRENT_RUNS)
    return CONCURRENT_RUNS * CONCURRENT_STEPS / (finished - started)


# Pure-Python work (no I/O): each process prints how long its share took.
_CPU_WORK = """
import json, time
started = time.perf_counter()
for i in range(150_000):
    json.loads(json.dumps({"step": i, "args": [i, str(i)]}))
print(time.perf_counter() - started)
"""


def box_scaling() -> float:
    """How much more CPU-bound work two processes do at once than one alone, on
    this box now: the ceiling of any two-worker ratio here (2.0 on two idle
    cores; a shared host often gives less, and it varies minute to minute)."""

    def together(count: int) -> float:
        processes = [
            subprocess.Popen([sys.executable, "-c", _CPU_WORK], stdout=subprocess.PIPE,
                             text=True)
            for _ in range(count)
        ]  # fmt: skip
        return max(float(p.communicate(timeout=120)[0]) for p in processes)

    return 2 * together(1) / together(2)


def postgres_url() -> str | None:
    url = os.environ.get("BENCH_POSTGRES_URL", DEFAULT_POSTGRES)
    try:
        import psycopg

        admin = url.rsplit("/", 1)[0] + "/postgres"
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(admin, autocommit=True, connect_timeout=2) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
    except Exception as exc:  # noqa: BLE001 - report and go on with SQLite only
        print(f"  (PostgreSQL skipped: {type(exc).__name__}: {exc})")
        return None
    return url


def child(database_url: str | None) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    argv = [sys.executable, "-m", "bench.bench_steps", "--child"]
    if database_url:
        argv.append(database_url)
    # Its progress lines (stderr) show as it goes; its figures come on stdout.
    done = subprocess.run(argv, cwd=BASE_DIR, env=environ, stdout=subprocess.PIPE,
                          text=True, timeout=900)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(
            f"benchmark child failed (exit {done.returncode}); see above"
        )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def row(name: str, figures: dict[str, Any]) -> str:
    if "error" in figures:
        return f"  {name:<44} {figures['error']}"
    return (
        f"  {name:<44} {figures['steps_per_s']:>9.1f} {figures['p50_ms']:>9.2f}"
        f" {figures['p99_ms']:>9.2f}"
    )


def main() -> None:
    print(f"{STEPS}-step scripted run, no-op tool; overhead = time between model calls")
    print(f"  {'':<44} {'steps/s':>9} {'p50 ms':>9} {'p99 ms':>9}")
    base = in_process()
    print(row("engine loop in process, no persistence", base), flush=True)
    print(row("LangGraph 50 nodes, SQLite checkpointer", langgraph()), flush=True)
    results = {"SQLite": child(None)}
    pg = postgres_url()
    if pg:
        results["PostgreSQL"] = child(pg)
    for db, figures in results.items():
        print(row(f"control plane, 1 worker, {db}", figures["single"]))
        target = "ok" if figures["single"]["p50_ms"] <= 15 else "MISSED"
        print(f"    p50 target ≤ 15 ms: {target}")
    for db, figures in results.items():
        one, two = figures["one_worker"], figures["two_workers"]
        ratio = statistics.median(two) / statistics.median(one)
        rounds = ", ".join(f"{b / a:.2f}" for a, b in zip(one, two, strict=True))
        verdict = "ok" if ratio >= 1.6 else "MISSED"
        box = figures["box_scaling"]
        print(
            f"  {CONCURRENT_RUNS} concurrent runs × {CONCURRENT_STEPS} steps, {db}, "
            f"median of {ROUNDS}: 1 worker {statistics.median(one):.1f} steps/s, "
            f"2 workers {statistics.median(two):.1f} steps/s, ratio {ratio:.2f} "
            f"(target ≥ 1.6: {verdict}; by round: {rounds})\n"
            f"    baseline, the box itself: 2 CPU-bound processes do "
            f"{statistics.median(box):.2f}x the work of 1 (by round: "
            + ", ".join(f"{b:.2f}" for b in box)
            + ")"
        )


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        figures = control_plane(sys.argv[2] if len(sys.argv) > 2 else None)
        print(json.dumps(figures))
    else:
        main()
