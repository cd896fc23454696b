"""Approval gates with real Celery workers on the test database."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from approvals.models import ApprovalDecision, ApprovalPolicyRule, ApprovalRequest
from controlplane.celery import app as celery_app
from controlplane.models import AuditEvent
from controlplane.services import membership_set
from runs.models import Run, ToolCall
from runs.services import run_start
from runs.services.decide import approval_decide
from shop.models import Refund, Replacement
from tests.approvals.conftest import (
    REFUND_ARGS,
    REPLACE_ARGS,
    call,
    script_of,
    wait_until,
)
from tests.conftest import start_worker

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def settled(run: Run) -> Run | None:
    run.refresh_from_db()
    return run if run.status in Run.TERMINAL else None


def test_two_concurrent_approvals_give_one_decision_one_execution_one_audit_entry(
    waiting_run, operator_user, admin_user, api_client_for, tenant,
    celery_worker_process,
):  # fmt: skip
    run, approval = waiting_run(script_of(call("create_replacement", REPLACE_ARGS)))
    clients = [
        api_client_for(operator_user, tenant),
        api_client_for(admin_user, tenant),
    ]
    barrier = threading.Barrier(len(clients))
    statuses: list[int] = []

    def approve(client: Any) -> None:
        barrier.wait()
        response = client.post(
            f"/api/v1/approvals/{approval.id}/decide/",
            {"decision": "approve"},
            format="json",
        )
        statuses.append(response.status_code)

    threads = [threading.Thread(target=approve, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(statuses) == [200, 409]
    run = wait_until(lambda: settled(run))
    assert run.status == Run.Status.UNVERIFIED, run.stop_detail
    assert Replacement.objects.count() == 1
    assert ToolCall.objects.get(run=run).attempts == 1
    assert ApprovalDecision.objects.count() == 1
    assert AuditEvent.objects.filter(action="approval.approve").count() == 1


def test_a_deny_means_the_handler_never_ran_and_the_shop_is_unchanged(
    waiting_run, operator_user, celery_worker_process
):
    run, approval = waiting_run(script_of(call("refund", REFUND_ARGS)))
    approval_decide(
        request=approval, decided_by=operator_user, approve=False, reason="photo first"
    )
    run = wait_until(lambda: settled(run))
    assert Refund.objects.count() == 0
    row = ToolCall.objects.get(run=run)
    assert row.status == "denied" and row.started_at is None
    assert "photo first" in row.observation["content"]


def test_approval_after_expiry_or_after_the_role_was_removed_is_not_executed(
    tenant, waiting_run, operator_user, make_member, tmp_path
):
    # No worker while the world changes; then one starts and resumes both runs.
    expired_run, expired = waiting_run(
        script_of(call("refund", REFUND_ARGS)), slug="expired"
    )
    demoted_run, demoted = waiting_run(
        script_of(call("create_replacement", REPLACE_ARGS)), slug="demoted"
    )
    second = make_member(tenant, "olga-operator", "operator")
    approval_decide(request=expired, decided_by=operator_user, approve=True)
    ApprovalRequest.objects.filter(id=expired.id).update(
        expires_at=expired.requested_at
    )
    approval_decide(request=demoted, decided_by=second, approve=True)
    membership_set(tenant=tenant, user=second, role="viewer")
    worker = start_worker(tmp_path)
    try:
        expired_run = wait_until(lambda: settled(expired_run))
        demoted_run = wait_until(lambda: settled(demoted_run))
    finally:
        worker.stop()
    assert Refund.objects.count() == 0 and Replacement.objects.count() == 0
    for run, words in [(expired_run, "expired"), (demoted_run, "no longer holds")]:
        row = ToolCall.objects.get(run=run)
        assert row.status == "denied" and row.attempts == 0
        assert words in row.observation["content"]


def test_a_policy_rule_that_raises_blocks_the_call(
    shop_agent, tenant, operator_user, celery_worker_process
):
    # Written around save-time validation: `>` on a string argument raises.
    ApprovalPolicyRule.objects.create(
        tenant=tenant, name="corrupt", tool="refund", action="allow",
        conditions=[{"arg": "order_id", "op": ">", "value": 1}],
    )  # fmt: skip
    agent = shop_agent(script_of(call("refund", REFUND_ARGS)))
    run = run_start(tenant=tenant, agent_slug=agent.slug, input="x", started_by=None)
    run = wait_until(lambda: settled(run))
    assert run.status == Run.Status.POLICY_BLOCKED
    assert Refund.objects.count() == 0
    row = ToolCall.objects.get(run=run)
    assert row.status == "denied" and row.attempts == 0
    assert not ApprovalRequest.objects.exists()


def queued_messages() -> int:
    with celery_app.connection_for_write() as connection:
        client = connection.default_channel.client
        return int(client.llen(celery_app.conf.task_default_queue))


def test_200_waiting_runs_resume_after_workers_restart_and_nothing_runs_twice(
    shop_agent, tenant, operator_user, tmp_path
):
    agent = shop_agent(script_of(call("create_replacement", REPLACE_ARGS)))
    worker = start_worker(tmp_path, concurrency=2)
    try:
        for index in range(200):
            run_start(
                tenant=tenant, agent_slug=agent.slug, input=f"#{index}", started_by=None
            )
        wait_until(
            lambda: Run.objects.filter(status="waiting_approval").count() == 200,
            timeout=120,
        )
    finally:
        worker.stop()
    # Workers stopped: a waiting run has no task anywhere, not even queued.
    assert queued_messages() == 0
    assert Replacement.objects.count() == 0
    for approval in ApprovalRequest.objects.filter(status="pending"):
        approval_decide(request=approval, decided_by=operator_user, approve=True)
    assert queued_messages() == 200  # one resume each, enqueued on commit
    worker = start_worker(tmp_path, concurrency=2)
    try:
        wait_until(
            lambda: Run.objects.filter(status__in=Run.TERMINAL).count() == 200,
            timeout=150,
        )
    finally:
        worker.stop()
    assert set(Run.objects.values_list("status", flat=True)) == {"unverified"}
    assert Replacement.objects.count() == 200
    assert list(ToolCall.objects.values_list("status", "attempts").distinct()) == [
        ("succeeded", 1)
    ]


def tool_message(run: Run, call_id: str) -> str:
    """What the model was given as the result of `call_id`."""
    return next(
        str(m["content"])
        for m in run.engine_state["messages"]
        if m.get("role") == "tool" and m.get("tool_call_id") == call_id
    )


def test_a_deny_rule_added_while_a_refund_waits_stops_it_after_approval(
    tenant, waiting_run, admin_user, operator_user, api_client_for, tmp_path
):
    run, approval = waiting_run(script_of(call("refund", REFUND_ARGS)))
    admin = api_client_for(admin_user, tenant)
    created = admin.post(
        "/api/v1/approval-rules/",
        {"name": "no refunds this week", "tool": "refund", "action": "deny"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    decided = api_client_for(operator_user, tenant).post(
        f"/api/v1/approvals/{approval.id}/decide/",
        {"decision": "approve"},
        format="json",
    )
    assert decided.status_code == 200, decided.json()
    worker = start_worker(tmp_path)
    try:
        run = wait_until(lambda: settled(run))
    finally:
        worker.stop()
    assert Refund.objects.count() == 0
    row = ToolCall.objects.get(run=run)
    assert (row.status, row.attempts, row.started_at) == ("denied", 0, None)
    assert row.result["error"]["code"] == "EPERM"
    said = tool_message(run, "call_refund")
    assert "refund was approved but not executed" in said
    assert "denied by no refunds this week" in said
    assert said in row.observation["content"]
    # The run went on: the model was asked again, with that observation.
    assert run.steps == 2 and run.status == Run.Status.UNVERIFIED, run.stop_detail


def test_a_replacement_approved_after_a_full_refund_is_not_shipped(
    tenant, demo_agent, operator_user, api_client_for, tmp_path
):
    from decimal import Decimal

    from shop.models import ShopOrder
    from tests.runs.conftest import drive

    run = run_start(
        tenant=tenant, agent_slug=demo_agent.slug, input="help", started_by=None
    )
    run = drive(run)
    assert run.status == Run.Status.WAITING_APPROVAL, run.stop_detail
    approval = ApprovalRequest.objects.get(run=run, status="pending")
    assert approval.tool_name == "create_replacement"
    order = ShopOrder.objects.get(tenant=tenant, order_id="4821")
    Refund.objects.create(order=order, amount=order.amount, reason="by phone")
    decided = api_client_for(operator_user, tenant).post(
        f"/api/v1/approvals/{approval.id}/decide/",
        {"decision": "approve"},
        format="json",
    )
    assert decided.status_code == 200, decided.json()
    worker = start_worker(tmp_path)
    try:
        run = wait_until(lambda: settled(run))
    finally:
        worker.stop()
    assert Replacement.objects.count() == 0
    assert list(Refund.objects.values_list("amount", flat=True)) == [Decimal("89.00")]
    row = ToolCall.objects.get(run=run, call_id="call_replace")
    assert (row.status, row.attempts, row.started_at) == ("denied", 0, None)
    said = tool_message(run, "call_replace")
    assert "its precondition no longer holds" in said
    assert "refunded in full" in said
    # The evaluator judges the recorded results, not the model's word.
    assert run.status == Run.Status.FAILED, (run.status, run.stop_detail)
    assert "no replacement was shipped" in run.evaluation["reason"]
