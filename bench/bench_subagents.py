"""Sub-agent benchmark (issue 28 item 6), two real Celery workers (concurrency 1
each):

  * a parent run that delegates to 20 sub-agents in one step (20 parallel child
    runs of 8 steps each: seven `echo` calls, then the answer), then answers;
    wall time from its start to its end;
  * baseline measured in the same run: one child run alone, and the same 20
    child runs started side by side with no parent (what the parent adds);
  * while the parent waits, sampled every few milliseconds: whether a worker
    holds the parent (its lease, or an active task of it on a worker: asked of
    the workers with `inspect`), and how many runs hold a worker at once.
    Target: 0 worker slots busy on the parent while it waits.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from bench.agents import scripted_agent
from bench.django_env import Workers, django_setup

CHILDREN = 20
CHILD_STEPS = 8
POLL_SECONDS = 0.005
ECHO = {"text": "working on it " * 10}


def _child_script() -> list[dict[str, Any]]:
    echoes = [
        {
            "tool_calls": [
                {
                    "id": f"e{n}",
                    "name": "echo",
                    "arguments": {"text": f"step {n}: {ECHO['text']}"},
                }
            ]
        }
        for n in range(CHILD_STEPS - 1)
    ]
    return [*echoes, {"text": "part done"}]


def _parent(tenant: Any) -> Any:
    from runs.services.agents import agent_update

    agent = scripted_agent(tenant, "lead")
    calls = [
        {"id": f"c{n}", "name": "agent__helper", "arguments": {"task": f"part {n}"}}
        for n in range(CHILDREN)
    ]
    agent_update(
        agent=agent, actor=None, partial=True,
        config={"subagents": ["helper"],
                "script": [{"tool_calls": calls}, {"text": "all parts done"}]},
    )  # fmt: skip
    return agent


def _wait_ended(run_ids: list[Any], timeout: float = 300.0) -> None:
    from runs.models import Run

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Run.objects.filter(id__in=run_ids).exclude(status__in=Run.TERMINAL):
            return
        time.sleep(POLL_SECONDS)
    raise RuntimeError("runs did not end")


def _active_tasks_of(run_id: str) -> int:
    """Tasks of this run the workers are executing or hold reserved now."""
    from controlplane.celery import app

    inspect = app.control.inspect(timeout=0.5)
    count = 0
    for tasks in [
        *(inspect.active() or {}).values(),
        *(inspect.reserved() or {}).values(),
    ]:
        for task in tasks:
            if (task.get("kwargs") or {}).get("run_id") == run_id:
                count += 1
    return count


def main() -> None:
    django_setup(os.environ.get("BENCH_DATABASE_URL") or None)
    from controlplane.services import tenant_create
    from runs.models import Run
    from runs.services import run_start
    from tracing.models import Span

    tenant = tenant_create(slug=f"bench-{os.getpid()}", name="Bench")
    scripted_agent(
        tenant, "helper", tools=["echo"], script=_child_script(),
        default_limits={"max_steps": 10},
    )  # fmt: skip
    _parent(tenant)

    with Workers(2):
        # Baselines: one child alone; 20 children side by side, no parent.
        started = time.monotonic()
        one = run_start(tenant=tenant, agent_slug="helper", input="x", started_by=None)
        _wait_ended([one.id])
        one_s = time.monotonic() - started
        started = time.monotonic()
        side = [
            run_start(
                tenant=tenant, agent_slug="helper", input=f"p{n}", started_by=None
            )
            for n in range(CHILDREN)
        ]
        _wait_ended([run.id for run in side])
        side_s = time.monotonic() - started

        # The parent.
        started = time.monotonic()
        parent = run_start(
            tenant=tenant, agent_slug="lead", input="go", started_by=None
        )
        parent_id = str(parent.id)
        samples = waiting_samples = held_by_parent = 0
        busy_max = 0
        inspections: list[int] = []
        stop = threading.Event()

        def inspector() -> None:  # the workers' own word, beside the sampling
            while not stop.is_set():
                if Run.objects.filter(
                    id=parent_id, status=Run.Status.WAITING_SUBAGENTS
                ).exists():
                    inspections.append(_active_tasks_of(parent_id))
                time.sleep(0.05)

        thread = threading.Thread(target=inspector, daemon=True)
        thread.start()
        while True:
            row = Run.objects.filter(id=parent.id).values(
                "status", "lease_owner", "step_token"
            )[0]
            if row["status"] in Run.TERMINAL:
                break
            samples += 1
            if row["status"] == Run.Status.WAITING_SUBAGENTS:
                waiting_samples += 1
                if row["lease_owner"] or row["step_token"] is not None:
                    held_by_parent += 1
                busy = Run.objects.filter(tenant=tenant).exclude(lease_owner="").count()
                busy_max = max(busy_max, busy)
            time.sleep(POLL_SECONDS)
        parent_s = time.monotonic() - started
        stop.set()
        thread.join()
        inspected, tasks_of_parent = len(inspections), max(inspections, default=0)
        waited = [
            (s.name, s.started_at, s.ended_at)
            for s in Span.objects.filter(run=parent, name__startswith="step")
        ]
        parent.refresh_from_db()
        children = list(Run.objects.filter(parent_run=parent))
    steps = sorted(waited, key=lambda w: w[1])
    first_step_s = (steps[0][2] - steps[0][1]).total_seconds() if steps else 0.0
    wait_s = (steps[1][1] - steps[0][2]).total_seconds() if len(steps) > 1 else 0.0
    answered = sum(1 for c in children if c.final_answer == "part done")
    print(f"one child run alone: {one_s:.2f} s")
    print(f"{CHILDREN} child runs side by side, no parent (baseline): {side_s:.2f} s")
    print(
        f"parent with {CHILDREN} parallel children on 2 workers: {parent_s:.2f} s "
        f"({parent.status}, {parent.final_answer!r}; {answered}/{len(children)} "
        "children answered)"
    )
    print(
        f"the parent's first step (model call, {CHILDREN} children started): "
        f"{first_step_s:.2f} s; then it waited, holding nothing, {wait_s:.2f} s"
    )
    print(
        f"while the parent waited ({waiting_samples} of {samples} samples): "
        f"samples with the parent holding a worker (lease or step token): "
        f"{held_by_parent}; the parent's tasks active or reserved on a worker, "
        f"max over {inspected} inspections: {tasks_of_parent}; runs holding a "
        f"worker at once, max: {busy_max} (2 workers)"
    )
    assert parent.final_answer == "all parts done", parent.stop_detail
    assert answered == CHILDREN
    assert held_by_parent == 0 and tasks_of_parent == 0


if __name__ == "__main__":
    main()
