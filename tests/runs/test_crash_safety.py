"""Spec scenarios 1–5: a worker killed (SIGKILL) at any point of a step loses
nothing and repeats no side effect. Real worker processes, really killed."""

from __future__ import annotations

import time
from typing import Any

import pytest

from approvals.models import ApprovalRequest
from runs.models import Run, ToolCall
from runs.services import recover_stalled_runs, run_start
from runs.services.decide import approval_decide
from shop.models import Refund, Replacement
from tests.conftest import start_worker, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

REPLACE_SCRIPT = [
    {"tool_calls": [{"id": "c1", "name": "create_replacement",
                     "arguments": {"order_id": "4821", "reason": "dented spout"}}]},
    {"text": "Replacement on its way."},
]  # fmt: skip
REFUND_SCRIPT = [
    {"tool_calls": [{"id": "c1", "name": "refund",
                     "arguments": {"order_id": "4821", "amount": 10,
                                   "reason": "dent"}}]},
    {"text": "Refunded."},
]  # fmt: skip
LOOKUP_SCRIPT = [
    {"tool_calls": [{"id": "c1", "name": "lookup_order",
                     "arguments": {"order_id": "4821"}}]},
    {"text": "Found it."},
]  # fmt: skip


def settled(run: Run) -> Run | None:
    run.refresh_from_db()
    return run if run.is_terminal else None


def approve_when_asked(run: Run, user: Any) -> None:
    approval = wait_for(lambda: ApprovalRequest.objects.filter(run=run).first())
    approval_decide(request=approval, decided_by=user, approve=True)


def crashing_worker(tmp_path, failpoint: str, **kwargs: Any):
    return start_worker(
        tmp_path,
        extra_env={"RUN_FAILPOINTS": failpoint, "RUN_FAILPOINT_DIR": str(tmp_path)},
        **kwargs,
    )


def start_scripted(tenant, scripted_agent, script) -> Run:
    scripted_agent(script, ["create_replacement", "refund", "lookup_order"])
    return run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)


def test_idempotent_write_killed_after_its_effect_reruns_with_the_same_key(
    shop, scripted_agent, operator_user, tmp_path
):
    worker = crashing_worker(tmp_path, "after_tool_execute")
    try:
        run = start_scripted(shop, scripted_agent, REPLACE_SCRIPT)
        approve_when_asked(run, operator_user)
        run = wait_for(lambda: settled(run))
    finally:
        worker.stop()
    assert (tmp_path / "failpoint-after_tool_execute").exists()  # it really died
    assert run.status == "unverified", (run.stop_reason, run.stop_detail)
    assert Replacement.objects.count() == 1  # the retry reused the key
    call = ToolCall.objects.get(run=run)
    assert (call.status, call.attempts) == ("succeeded", 2)
    assert call.result["data"]["created"] is False


def test_irreversible_write_killed_after_its_effect_is_never_repeated(
    shop, scripted_agent, operator_user, tmp_path
):
    worker = crashing_worker(tmp_path, "after_tool_execute")
    try:
        run = start_scripted(shop, scripted_agent, REFUND_SCRIPT)
        approve_when_asked(run, operator_user)
        run = wait_for(lambda: settled(run))
    finally:
        worker.stop()
    assert (tmp_path / "failpoint-after_tool_execute").exists()
    assert Refund.objects.count() == 1
    call = ToolCall.objects.get(run=run)
    assert (call.status, call.attempts) == ("unknown", 1)
    assert call.result["error"]["code"] == "EUNKNOWN"
    assert "check the current state" in call.observation["content"]


def test_irreversible_write_killed_before_its_handler_runs_is_not_run_blind(
    shop, scripted_agent, operator_user, tmp_path
):
    worker = crashing_worker(tmp_path, "before_tool_execute")
    try:
        run = start_scripted(shop, scripted_agent, REFUND_SCRIPT)
        approve_when_asked(run, operator_user)
        run = wait_for(lambda: settled(run))
    finally:
        worker.stop()
    assert Refund.objects.count() == 0
    assert ToolCall.objects.get(run=run).status == "unknown"


def test_read_only_call_killed_after_the_action_was_persisted_runs_once_more(
    shop, scripted_agent, tmp_path
):
    worker = crashing_worker(tmp_path, "after_action_persisted")
    try:
        run = start_scripted(shop, scripted_agent, LOOKUP_SCRIPT)
        run = wait_for(lambda: settled(run))
    finally:
        worker.stop()
    assert (tmp_path / "failpoint-after_action_persisted").exists()
    assert run.status == "unverified"
    assert run.steps == 2  # the model was not asked twice for the same step
    assert ToolCall.objects.get(run=run).status == "succeeded"


def test_whole_worker_killed_mid_call_is_recovered_by_another_worker(
    shop, scripted_agent, operator_user, tmp_path, settings
):
    """A solo worker dies whole (its message dies with it); once the lease
    expires the recovery sweep hands the run to a new worker."""
    settings.RUN_LEASE_SECONDS = 2.0
    lease = {"RUN_LEASE_SECONDS": "2"}
    first = start_worker(
        tmp_path,
        pool="solo",
        extra_env={**lease, "RUN_FAILPOINTS": "after_tool_execute",
                   "RUN_FAILPOINT_DIR": str(tmp_path)},
    )  # fmt: skip
    run = start_scripted(shop, scripted_agent, REPLACE_SCRIPT)
    approve_when_asked(run, operator_user)
    wait_for(lambda: first.process.poll() is not None)  # SIGKILLed at the failpoint
    run.refresh_from_db()
    assert run.status == "running" and not run.is_terminal
    second = start_worker(tmp_path, extra_env=lease)
    try:
        wait_for(lambda: time.sleep(2.1) or recover_stalled_runs())
        run = wait_for(lambda: settled(run))
    finally:
        second.stop()
    assert run.status == "unverified", (run.stop_reason, run.stop_detail)
    assert Replacement.objects.count() == 1
    assert ToolCall.objects.get(run=run).attempts == 2


def test_duplicate_delivery_of_a_step_is_a_no_op(shop, scripted_agent, tmp_path):
    from runs.tasks import advance_run_task

    worker = start_worker(tmp_path)
    try:
        run = start_scripted(shop, scripted_agent, LOOKUP_SCRIPT)
        token = str(run.step_token)
        advance_run_task.delay(run_id=str(run.id), step_token=token)  # a duplicate
        run = wait_for(lambda: settled(run))
    finally:
        worker.stop()
    assert run.steps == 2
    assert ToolCall.objects.filter(run=run).count() == 1
    assert ToolCall.objects.get(run=run).attempts == 1
