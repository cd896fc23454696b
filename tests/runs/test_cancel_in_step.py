"""Cancelling a run while a worker is inside one of its steps (real worker)."""

from __future__ import annotations

import time

import pytest

from runs.models import Run, Step, ToolCall
from runs.services import run_cancel, run_start
from tests.conftest import wait_for
from tracing.models import Span

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SLOW_THEN_MORE = [
    {"tool_calls": [{"id": "c1", "name": "run_code",
                     "arguments": {"code": "import time; time.sleep(2)"}}]},
    {"tool_calls": [{"id": "c2", "name": "echo", "arguments": {"text": "again"}}]},
    {"text": "done"},
]  # fmt: skip


def test_a_run_cancelled_mid_step_stops_at_the_next_boundary_not_after_its_lease(
    scripted_agent, tenant, operator_user, celery_worker_process
):
    scripted_agent(SLOW_THEN_MORE, ["run_code", "echo"])
    run = run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
    wait_for(
        lambda: Span.objects.filter(
            run=run, name="execute_tool run_code", status=Span.Status.RUNNING
        ).exists(),
        what="the slow tool to start",
    )
    asked = time.monotonic()
    run_cancel(run=run, actor=operator_user)

    def ended() -> Run | None:
        run.refresh_from_db()
        return run if run.is_terminal else None

    run = wait_for(ended, timeout=30, what="the run to end")
    # Well inside the lease (120 s): the worker saw the request itself.
    assert time.monotonic() - asked < 30
    assert (run.status, run.stop_reason) == ("cancelled", "cancelled")
    assert Step.objects.filter(run=run).count() == 1  # no model call after it
    assert not ToolCall.objects.filter(run=run, tool_name="echo").exists()
    assert run.lease_owner == "" and run.step_token is None
