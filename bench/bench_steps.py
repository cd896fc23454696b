"""Step benchmark (issue 3): control-plane overhead per step and worker scaling.

Measured in one run, side by side:
  * the engine loop in process, no persistence (the floor);
  * LangGraph running an equivalent 50-node scripted agent on its SQLite checkpointer;
  * our control plane: a 50-step scripted run with a no-op tool on one real Celery
    worker, on SQLite and on PostgreSQL (BENCH_POSTGRES_URL, when reachable);
  * throughput of 20 concurrent 10-step runs on one worker and on two.

Per-step overhead is the time between consecutive model calls: with a scripted
model and a no-op tool, everything in between is the control plane.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.django_env import BASE_DIR, percentile

STEPS = 50
CONCURRENT_RUNS = 20
CONCURRENT_STEPS = 10
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
    """Runs in a child process: Django reads its settings once per process."""
    from bench.django_env import Workers, django_setup

    django_setup(database_url)
    from controlplane.services import tenant_create
    from runs.models import Agent, Run
    from runs.services import run_start

    tenant = tenant_create(slug=f"bench-{os.getpid()}", name="Bench")
    for slug, steps in (("long", STEPS), ("short", CONCURRENT_STEPS)):
        Agent.objects.create(
            tenant=tenant, slug=slug, name=slug, model_adapter="scripted",
            model="scripted", tool_names=["echo"], script=echo_script(steps),
            default_limits={"max_steps": steps + 5, "max_tool_calls": steps + 5},
        )  # fmt: skip

    def wait_all(ids: list[Any]) -> float:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            open_runs = Run.objects.filter(id__in=ids).exclude(
                status__in=[s.value for s in Run.TERMINAL]
            )
            if not open_runs.exists():
                return time.perf_counter()
            time.sleep(0.02)
        raise RuntimeError("runs did not finish")

    out: dict[str, Any] = {}
    workers = Workers(1)
    try:
        run = run_start(tenant=tenant, agent_slug="long", input="go", started_by=None)
        started = time.perf_counter()
        wait_all([run.id])
        total = time.perf_counter() - started
        run.refresh_from_db()
        assert run.status == "unverified", (
            run.status,
            run.stop_reason,
            run.stop_detail,
        )
        stamps = [s.started_at.timestamp() for s in run.step_rows.order_by("index")]
        out["single"] = summary(intervals(stamps), total, STEPS)
        out["one_worker"] = throughput(tenant, wait_all)
    finally:
        workers.stop()
    workers = Workers(2)
    try:
        out["two_workers"] = throughput(tenant, wait_all)
    finally:
        workers.stop()
    return out


def throughput(tenant: Any, wait_all: Any) -> float:
    from runs.services import run_start

    started = time.perf_counter()
    ids = [
        run_start(tenant=tenant, agent_slug="short", input="go", started_by=None).id
        for _ in range(CONCURRENT_RUNS)
    ]
    finished = wait_all(ids)
    return CONCURRENT_RUNS * CONCURRENT_STEPS / (finished - started)


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
    done = subprocess.run(argv, cwd=BASE_DIR, env=environ, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{done.stderr[-3000:]}")
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
        ratio = two / one
        verdict = "ok" if ratio >= 1.6 else "MISSED"
        print(
            f"  {CONCURRENT_RUNS} concurrent runs × {CONCURRENT_STEPS} steps, {db}: "
            f"1 worker {one:.1f} steps/s, 2 workers {two:.1f} steps/s, "
            f"ratio {ratio:.2f} (target ≥ 1.6: {verdict})"
        )


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        figures = control_plane(sys.argv[2] if len(sys.argv) > 2 else None)
        print(json.dumps(figures))
    else:
        main()
