"""Approval benchmark (issue 5), one real Celery worker:

  * decide → tool start: from the decide API call returning (DRF view, in process)
    to the approved tool call's `started_at`, p50/p99 over 200 approvals;
  * baseline measured in the same run: a plain run start (enqueue on commit) → the
    step task taking the run's lease (`started_at`), with no approval;
  * what 1,000 runs waiting for approval hold: tasks active/reserved on the worker,
    messages on the queue, and the worker's process count against the idle worker.

Waiting runs beyond the first are cloned from a real waiting run (same rows a
waiting run has: run, step, tool call, approval request); the 200 approved ones
then resume through the normal path and must each ship exactly one replacement.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from bench.agents import scripted_agent
from bench.django_env import Workers, django_setup, percentile

APPROVALS = 200
BASELINE_RUNS = 100
WAITING_RUNS = 1000
POLL_SECONDS = 0.002


def _processes_of(pids: list[int]) -> int:
    """The processes in these process trees (the worker and its pool children)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    seen, todo = 0, list(pids)
    while todo:
        pid = todo.pop()
        seen += 1
        todo.extend(children.get(pid, []))
    return seen


def _holding(workers: Workers) -> dict[str, int]:
    from django.conf import settings

    from controlplane.celery import app

    inspect = app.control.inspect(timeout=2.0)
    active = sum(len(v) for v in (inspect.active() or {}).values())
    reserved = sum(len(v) for v in (inspect.reserved() or {}).values())
    with app.connection_for_write() as connection:
        queued = connection.default_channel.client.llen(
            settings.CELERY_TASK_DEFAULT_QUEUE
        )
    return {
        "tasks_active": active,
        "tasks_reserved": reserved,
        "queued_messages": int(queued),
        "worker_processes": _processes_of([p.pid for p in workers.processes]),
    }


def _clone_waiting(template_run_id: Any, count: int) -> list[Any]:
    """`count` copies of a waiting run, with their step, call and approval rows."""
    from approvals.models import ApprovalRequest
    from runs.engine.tools import idempotency_key_for
    from runs.models import Run, Step, ToolCall

    run = Run.objects.get(id=template_run_id)
    step = Step.objects.get(run=run)
    row = ToolCall.objects.get(run=run)
    approval = ApprovalRequest.objects.get(run=run)
    runs, steps, rows, approvals = [], [], [], []
    for index in range(count):
        new_run = Run.objects.get(id=run.id)
        new_run.id, new_run.input = uuid.uuid4(), f"clone {index}"
        new_run.trace_id = uuid.uuid4().hex
        new_step = Step.objects.get(id=step.id)
        new_step.pk, new_step.run = None, new_run
        new_row = ToolCall.objects.get(id=row.id)
        new_row.id, new_row.run = uuid.uuid4(), new_run
        new_row.idempotency_key = idempotency_key_for(str(new_run.id), row.call_id)
        new_approval = ApprovalRequest.objects.get(id=approval.id)
        new_approval.id, new_approval.run, new_approval.tool_call = (
            uuid.uuid4(), new_run, new_row,
        )  # fmt: skip
        runs.append(new_run)
        steps.append(new_step)
        rows.append(new_row)
        approvals.append(new_approval)
    Run.objects.bulk_create(runs, batch_size=200)
    Step.objects.bulk_create(steps, batch_size=200)
    for new_row, new_step in zip(rows, steps, strict=True):
        new_row.step = new_step
    ToolCall.objects.bulk_create(rows, batch_size=200)
    ApprovalRequest.objects.bulk_create(approvals, batch_size=200)
    return [a.id for a in approvals]


def _wait(predicate: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL_SECONDS)
    raise RuntimeError("timed out waiting")


def main() -> None:
    django_setup(os.environ.get("BENCH_DATABASE_URL") or None)
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    from approvals.models import ApprovalRequest
    from controlplane.services import api_token_issue, membership_set, tenant_create
    from runs.demo import demo_seed_shop
    from runs.models import Run, ToolCall
    from runs.services import run_start
    from shop.models import Replacement

    tenant = tenant_create(slug=f"bench-{os.getpid()}", name="Bench")
    operator = get_user_model().objects.create_user(username=f"op-{os.getpid()}")
    membership_set(tenant=tenant, user=operator, role="operator")
    demo_seed_shop(tenant=tenant)
    scripted_agent(
        tenant, "gate", tools=["create_replacement"],
        script=[
            {"tool_calls": [{"id": "c1", "name": "create_replacement",
                             "arguments": {"order_id": "4821", "reason": "dented"}}]},
            {"text": "Shipped."},
        ],
    )  # fmt: skip
    scripted_agent(tenant, "plain", script=[{"text": "hello"}])
    client = APIClient()
    secret = api_token_issue(tenant=tenant, user=operator).secret
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")

    workers = Workers(1)
    try:
        idle = _holding(workers)
        # Baseline: enqueue on commit → the step task takes the lease.
        baseline = []
        for _ in range(BASELINE_RUNS):
            run = run_start(
                tenant=tenant, agent_slug="plain", input="hi", started_by=None
            )
            returned = time.time()
            _wait(lambda run=run: Run.objects.filter(id=run.id, status__in=Run.TERMINAL)
                  .exists())  # fmt: skip
            run.refresh_from_db()
            assert run.started_at is not None
            baseline.append((run.started_at.timestamp() - returned) * 1000)
        # One real waiting run, then clones of it.
        template = run_start(
            tenant=tenant, agent_slug="gate", input="x", started_by=None
        )
        _wait(lambda: Run.objects.filter(id=template.id, status="waiting_approval")
              .exists())  # fmt: skip
        started = time.monotonic()
        clones = _clone_waiting(template.id, APPROVALS + WAITING_RUNS - 1)
        cloned_s = time.monotonic() - started
        waiting = Run.objects.filter(status="waiting_approval").count()
        time.sleep(1.0)
        held = _holding(workers)
        # 200 approvals, one after the other, through the decide API.
        latencies = []
        for approval_id in [
            template_approval_id(template.id),
            *clones[: APPROVALS - 1],
        ]:
            response = client.post(
                f"/api/v1/approvals/{approval_id}/decide/",
                {"decision": "approve"},
                format="json",
            )
            returned = time.time()
            assert response.status_code == 200, response.content
            row = _wait(
                lambda a=approval_id: ToolCall.objects.filter(
                    approval__id=a, started_at__isnull=False
                ).first()
            )
            latencies.append((row.started_at.timestamp() - returned) * 1000)
            run_id = row.run_id
            _wait(lambda r=run_id: Run.objects.filter(id=r, status__in=Run.TERMINAL)
                  .exists())  # fmt: skip
        approved_runs = ApprovalRequest.objects.filter(status="approved").values("run")
        outcomes = set(
            Run.objects.filter(id__in=approved_runs).values_list("status", flat=True)
        )
        replacements = Replacement.objects.count()
    finally:
        workers.stop()
    print(f"waiting runs: {waiting} ({WAITING_RUNS + APPROVALS - 1} cloned in "
          f"{cloned_s:.1f} s)")  # fmt: skip
    print(f"held by the idle worker:      {idle}")
    print(f"held with {waiting} runs waiting: {held}")
    print(
        f"baseline enqueue → task start (n={len(baseline)}): "
        f"p50 {percentile(baseline, 50):.1f} ms, p99 {percentile(baseline, 99):.1f} ms"
    )
    print(
        f"decide API return → tool start (n={len(latencies)}): "
        f"p50 {percentile(latencies, 50):.1f} ms, "
        f"p99 {percentile(latencies, 99):.1f} ms (target p99 ≤ 250 ms)"
    )
    print(f"approved runs ended {sorted(outcomes)}; replacements shipped: "
          f"{replacements} (expected {APPROVALS})")  # fmt: skip
    assert replacements == APPROVALS, replacements


def template_approval_id(run_id: Any) -> Any:
    from approvals.models import ApprovalRequest

    return ApprovalRequest.objects.get(run_id=run_id).id


if __name__ == "__main__":
    main()
