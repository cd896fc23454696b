"""What a run's spans and header say: step names, the verdict, the decisions."""

from __future__ import annotations

import json
from typing import Any

from approvals.models import ApprovalRequest
from runs.models import Run
from runs.services import run_start
from runs.services.agents import agent_update
from runs.spans import root_span_id
from tests.approvals.conftest import (
    REFUND_ARGS,
    REPLACE_ARGS,
    call,
    script_of,
    shop_agent,
    waiting_run,
)
from tests.runs.conftest import drive
from tracing.models import Span

__all__ = ["shop_agent", "waiting_run"]


def _children(client: Any, run: Run, parent: str) -> list[dict[str, Any]]:
    response = client.get(f"/api/v1/runs/{run.id}/spans/?parent={parent}&limit=500")
    assert response.status_code == 200, response.content
    return list(response.json()["results"])


def _decide(client: Any, approval: ApprovalRequest, **body: Any) -> dict[str, Any]:
    response = client.post(
        f"/api/v1/approvals/{approval.id}/decide/", body, format="json"
    )
    assert response.status_code == 200, response.content
    return dict(response.json())


def test_a_resumed_step_is_named_for_its_own_index(
    demo_agent: Any, operator_user: Any, api_client_for: Any
) -> None:
    client = api_client_for(operator_user, demo_agent.tenant)
    run = drive(
        run_start(
            tenant=demo_agent.tenant,
            agent_slug=demo_agent.slug,
            input="x",
            started_by=None,
        )
    )
    approval = ApprovalRequest.objects.get(run=run)
    _decide(client, approval, decision="approve")
    run = drive(run)
    assert run.is_terminal, run.stop_detail
    detail = client.get(f"/api/v1/runs/{run.id}/").json()
    indexes = [step["index"] for step in detail["step_rows"]]
    assert indexes == [0, 1, 2, 3]
    steps = [
        s
        for s in _children(client, run, f"{root_span_id(run):016x}")
        if s["name"].startswith("step ")
    ]
    names = [s["name"] for s in steps]
    # The task that ran the approved call finishes step 1; it is not "step 2".
    assert names == ["step 0", "step 1", "step 1 (resumed)", "step 2", "step 3"]
    assert len(set(names)) == len(names)
    for span in steps:
        index = span["attributes"]["cp.step.index"]
        assert index in indexes and span["name"].startswith(f"step {index}")
    resumed = steps[2]
    assert resumed["attributes"]["cp.step.resumed"] is True
    tools = [c["name"] for c in _children(client, run, resumed["span_id"])]
    assert tools == ["execute_tool create_replacement"]


def test_an_unverified_run_is_not_an_error_and_says_why(
    shop_agent: Any, operator_user: Any, api_client_for: Any
) -> None:
    agent = shop_agent(script_of(call("lookup_order", {"order_id": "4821"})))
    run = drive(
        run_start(
            tenant=agent.tenant, agent_slug=agent.slug, input="x", started_by=None
        )
    )
    assert run.status == Run.Status.UNVERIFIED
    root = Span.objects.get(run=run, span_id=f"{root_span_id(run):016x}")
    assert root.status != Span.Status.ERROR and root.status_message == ""
    assert "error.type" not in root.attributes
    assert root.attributes["cp.evaluation.verdict"] == "unverified"
    assert "no evaluator" in root.attributes["cp.evaluation.reason"]
    body = api_client_for(operator_user, agent.tenant).get(f"/api/v1/runs/{run.id}/")
    verdict = body.json()["verdict"]
    assert verdict["verdict"] == "unverified" and "no evaluator" in verdict["reason"]


def test_a_run_its_evaluator_failed_says_why_not_done(
    shop_agent: Any, operator_user: Any, api_client_for: Any
) -> None:
    agent = shop_agent(script_of(call("lookup_order", {"order_id": "4821"})))
    agent_update(
        agent=agent,
        actor=None,
        config={"evaluator": "kettlecraft_replacement"},
        partial=True,
    )
    run = drive(
        run_start(
            tenant=agent.tenant, agent_slug=agent.slug, input="x", started_by=None
        )
    )
    assert run.status == Run.Status.FAILED and run.evaluation
    reason = run.evaluation["reason"]
    root = Span.objects.get(run=run, span_id=f"{root_span_id(run):016x}")
    assert root.status == Span.Status.ERROR
    assert root.status_message == f"evaluation failed: {reason}"
    assert root.attributes["error.type"] == "evaluation_failed"
    assert root.attributes["cp.evaluation.verdict"] == "failed"
    assert root.attributes["cp.evaluation.reason"] == reason
    body = api_client_for(operator_user, agent.tenant).get(f"/api/v1/runs/{run.id}/")
    assert body.json()["verdict"] == {"verdict": "failed", "reason": reason}


def test_a_denied_approval_span_says_who_when_why_and_scope(
    waiting_run: Any, operator_user: Any, api_client_for: Any, tenant: Any
) -> None:
    run, approval = waiting_run(script_of(call("create_replacement", REPLACE_ARGS)))
    client = api_client_for(operator_user, tenant)
    decided = _decide(
        client, approval, decision="deny", reason="the customer asked for a refund"
    )
    run = drive(run)
    span = Span.objects.get(run=run, name="approval create_replacement")
    a = span.attributes
    assert a["cp.approval.status"] == "denied"
    assert a["cp.approval.decider"] == "oscar-operator"
    assert a["cp.approval.decision_reason"] == "the customer asked for a refund"
    assert a["cp.approval.scope"] == "once"
    assert a["cp.approval.decided_at"] == decided["decided_at"].replace("Z", "+00:00")
    assert "cp.approval.args_edited" not in a


def test_an_edited_approval_span_keeps_the_arguments_before_and_after(
    waiting_run: Any, operator_user: Any, api_client_for: Any, tenant: Any
) -> None:
    run, approval = waiting_run(script_of(call("refund", REFUND_ARGS)))
    edited = {**REFUND_ARGS, "amount": 10}
    client = api_client_for(operator_user, tenant)
    _decide(
        client, approval, decision="approve", args=edited, scope="run",
        reason="half of it is enough",
    )  # fmt: skip
    run = drive(run)
    a = Span.objects.get(run=run, name="approval refund").attributes
    assert a["cp.approval.status"] == "approved"
    assert a["cp.approval.scope"] == "run"
    assert a["cp.approval.decision_reason"] == "half of it is enough"
    assert a["cp.approval.args_edited"] is True
    assert a["cp.approval.args_edited_by"] == "oscar-operator"
    assert json.loads(a["cp.approval.args_before"]) == REFUND_ARGS
    assert json.loads(a["cp.approval.args_after"]) == edited
