"""`approval {tool}` covers the wait, across the two tasks around the decision."""

from __future__ import annotations

from typing import Any

from runs.models import Run
from runs.services.decide import approval_decide
from tests.approvals.conftest import (
    REPLACE_ARGS,
    call,
    script_of,
    shop_agent,
    waiting_run,
)
from tests.runs.conftest import drive
from tracing.models import RunEvent, Span

__all__ = ["shop_agent", "waiting_run"]


def test_the_approval_span_starts_at_the_request_and_ends_at_the_decision(
    waiting_run: Any, operator_user: Any
) -> None:
    run, approval = waiting_run(script_of(call("create_replacement", REPLACE_ARGS)))
    span = Span.objects.get(run=run, name="approval create_replacement")
    assert span.status == Span.Status.RUNNING and span.ended_at is None
    assert span.lease_expires_at is None  # waiting holds no worker
    assert span.attributes["cp.approval.status"] == "pending"
    assert span.attributes["gen_ai.tool.name"] == "create_replacement"
    step0 = Span.objects.get(run=run, name="step 0")
    assert span.parent_span_id == step0.span_id
    approval_decide(request=approval, decided_by=operator_user, approve=True)
    run = drive(run)
    assert run.status == Run.Status.UNVERIFIED, run.stop_detail
    span.refresh_from_db()
    assert span.status != Span.Status.RUNNING and span.ended_at is not None
    assert span.attributes["cp.approval.status"] == "approved"
    assert span.attributes["cp.approval.decider"] == operator_user.username
    assert span.attributes["cp.approval.wait_seconds"] >= 0
    assert span.attributes["cp.approval.rule"]
    assert span.parent_span_id == step0.span_id  # the same span, ended elsewhere
    tool = Span.objects.get(run=run, name="execute_tool create_replacement")
    assert tool.started_at >= span.started_at
    ends = RunEvent.objects.filter(
        run=run, type="span.ended", payload__span_id=span.span_id
    )
    assert ends.count() == 1
    assert not Span.objects.filter(run=run, status=Span.Status.RUNNING).exists()
