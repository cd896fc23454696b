"""The run engine on the Django side, driven task by task in this process."""

from __future__ import annotations

from typing import Any

import pytest
from celery.signals import before_task_publish
from django.db import transaction

from approvals.models import ApprovalRequest
from runs.models import Run, Step, ToolCall
from runs.services import run_advance, run_start
from runs.services.decide import approval_decide
from runs.spans import traceparent_for
from shop.models import Replacement


def test_demo_run_waits_for_approval_then_succeeds_with_one_replacement(
    demo_agent, operator_user, drive_run
):
    run = run_start(
        tenant=demo_agent.tenant,
        agent_slug="kettlecraft-support",
        input="order 4821 arrived damaged",
        started_by=operator_user,
    )
    run = drive_run(run)
    assert run.status == Run.Status.WAITING_APPROVAL
    assert run.step_token is None and run.lease_owner == ""
    assert Replacement.objects.count() == 0  # nothing happened before the decision
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.tool_name == "create_replacement"
    assert approval.args_snapshot == {
        "order_id": "4821",
        "reason": "arrived with a dented spout",
    }
    approval_decide(request=approval, decided_by=operator_user, approve=True)
    run = drive_run(run)
    assert run.status == Run.Status.SUCCEEDED, (run.stop_reason, run.stop_detail)
    assert run.stop_reason == "done"
    assert Replacement.objects.count() == 1
    date = Replacement.objects.get().delivery_date.isoformat()
    assert date in run.final_answer
    assert run.steps == 4 and run.tool_calls == 3
    assert Step.objects.filter(run=run).count() == 4
    assert list(
        ToolCall.objects.filter(run=run).values_list("tool_name", "status")
    ) == [
        ("lookup_order", "succeeded"),
        ("create_replacement", "succeeded"),
        ("get_delivery_date", "succeeded"),
    ]


def test_denied_replacement_is_observed_by_the_model_and_nothing_is_shipped(
    demo_agent, operator_user, drive_run
):
    run = run_start(
        tenant=demo_agent.tenant,
        agent_slug="kettlecraft-support",
        input="order 4821",
        started_by=operator_user,
    )
    run = drive_run(run)
    approval = ApprovalRequest.objects.get(run=run)
    approval_decide(
        request=approval, decided_by=operator_user, approve=False, reason="fraud check"
    )
    run = drive_run(run)
    assert Replacement.objects.count() == 0
    call = ToolCall.objects.get(run=run, tool_name="create_replacement")
    assert call.status == "denied"
    assert call.result["error"]["code"] == "EPERM"
    assert "fraud check" in call.observation["content"]
    # The script goes on; the evaluator sees no replacement, so the run failed.
    assert run.status == Run.Status.FAILED
    assert run.stop_reason == "done"


def test_a_stale_step_token_is_a_no_op(demo_agent, operator_user):
    run = run_start(
        tenant=demo_agent.tenant,
        agent_slug="kettlecraft-support",
        input="order 4821",
        started_by=operator_user,
    )
    outcome = run_advance(
        run_id=str(run.id), step_token="00000000-0000-0000-0000-000000000000", owner="x"
    )
    assert outcome == "skipped"
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and run.steps == 0
    assert not Step.objects.filter(run=run).exists()


def test_final_answer_without_an_evaluator_is_unverified(
    scripted_agent, tenant, drive_run
):
    scripted_agent([{"text": "All done!"}], [])
    run = run_start(tenant=tenant, agent_slug="scripted", input="hi", started_by=None)
    run = drive_run(run)
    assert run.status == Run.Status.UNVERIFIED
    assert run.final_answer == "All done!"


@pytest.mark.django_db(transaction=True)
def test_the_next_step_is_enqueued_after_commit_naming_its_run(
    demo_agent, operator_user
):
    sent: list[tuple[Any, dict[str, Any], Any]] = []

    def record(sender: Any = None, headers: Any = None, body: Any = None, **_: Any):
        sent.append((sender, headers, body))

    before_task_publish.connect(record)
    try:
        with transaction.atomic():
            run = run_start(
                tenant=demo_agent.tenant,
                agent_slug="kettlecraft-support",
                input="order 4821",
                started_by=operator_user,
            )
            assert sent == []  # nothing goes out before the commit
    finally:
        before_task_publish.disconnect(record)
    run.refresh_from_db()
    ((sender, headers, (args, kwargs, _)),) = sent
    assert sender == "runs.tasks.advance_run_task" and list(args) == []
    assert kwargs == {
        "run_id": str(run.id),
        "step_token": str(run.step_token),
        "traceparent": traceparent_for(run),
    }
    assert headers["kwargsrepr"] == f"{{'run_id': '{run.id}'}}"


def test_a_rule_added_while_the_model_thinks_applies_to_the_call_it_proposes(
    tenant, scripted_agent, monkeypatch, drive_run
):
    """The tenant's rules are read just before the call (with the cancel flag),
    not with the lease: an operator's deny during the model call stops it."""
    from approvals.models import ApprovalPolicyRule
    from runs.engine.adapters.scripted import ScriptedModel

    scripted_agent(
        [{"tool_calls": [{"id": "c1", "name": "echo", "arguments": {"text": "x"}}]},
         {"text": "done"}],
        ["echo"],
    )  # fmt: skip
    complete = ScriptedModel.complete

    def deny_meanwhile(self: Any, *args: Any, **kwargs: Any) -> Any:
        ApprovalPolicyRule.objects.create(
            tenant=tenant, name="no echo", tool="echo",
            action=ApprovalPolicyRule.Action.DENY,
        )  # fmt: skip
        return complete(self, *args, **kwargs)

    monkeypatch.setattr(ScriptedModel, "complete", deny_meanwhile)
    run = run_start(tenant=tenant, agent_slug="scripted", input="go", started_by=None)
    run = drive_run(run)
    assert run.status == Run.Status.POLICY_BLOCKED
    assert run.stop_reason == "policy_denied"
    call = ToolCall.objects.get(run=run)
    assert call.status == "denied" and call.result["error"]["code"] == "EPERM"
    assert "no echo" in call.result["error"]["message"]
    assert run.steps == 1  # the model was not asked again


def test_the_lease_reads_the_tenants_budget_with_the_run_as_it_is_now(
    scripted_agent: Any, tenant: Any
) -> None:
    """The step's budget comes in the run's own query (a join), and it is the
    budget as it is when the step starts: one created meanwhile is seen."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from budgets.models import Budget
    from runs.services.lifecycle import lease_acquire, lease_release

    scripted_agent([{"text": "done"}], [])
    run = run_start(tenant=tenant, agent_slug="scripted", input="go", started_by=None)
    with CaptureQueriesContext(connection) as queries:
        lease = lease_acquire(
            run_id=str(run.id), step_token=str(run.step_token), owner="first"
        )
    assert lease is not None and lease.budget is None
    assert Budget._meta.db_table not in _tables_read(queries)
    lease_release(lease.run)
    budget = Budget.objects.create(tenant=tenant, run_caps={"max_steps": 3})
    with CaptureQueriesContext(connection) as queries:
        lease = lease_acquire(
            run_id=str(run.id), step_token=str(run.step_token), owner="second"
        )
    assert lease is not None and lease.budget is not None
    assert (lease.budget.pk, lease.budget.run_caps) == (budget.pk, {"max_steps": 3})
    assert Budget._meta.db_table not in _tables_read(queries)  # no query of its own


def _tables_read(queries: Any) -> list[str]:
    """The table each SELECT reads first (its FROM)."""
    return [
        q["sql"].split(" FROM ", 1)[1].split()[0].strip('"`')
        for q in queries
        if q["sql"].startswith("SELECT") and " FROM " in q["sql"]
    ]


def test_a_cancel_asked_while_the_model_thinks_stops_the_run_before_its_call(
    tenant, operator_user, scripted_agent, monkeypatch, drive_run
):
    """The write of the model's action reads the cancel flag in its WHERE: a
    cancel asked during the model call still stops the run before the tool runs
    (the action is on record), and without one no read of the flag follows."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runs.engine.adapters.scripted import ScriptedModel
    from runs.services import run_cancel

    def echo(call_id: str) -> dict[str, Any]:
        return {
            "tool_calls": [{"id": call_id, "name": "echo", "arguments": {"text": "x"}}]
        }

    scripted_agent([echo("c1"), echo("c2"), {"text": "done"}], ["echo"])
    complete = ScriptedModel.complete
    asks = []

    def cancel_on_second_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        asks.append(1)
        if len(asks) == 2:
            run_cancel(run=Run.objects.get(pk=run.pk), actor=operator_user)
        return complete(self, *args, **kwargs)

    monkeypatch.setattr(ScriptedModel, "complete", cancel_on_second_call)
    run = run_start(tenant=tenant, agent_slug="scripted", input="go", started_by=None)
    with CaptureQueriesContext(connection) as first:
        run_advance(run_id=str(run.id), step_token=str(run.step_token), owner="one")
    cancel_reads = [
        q for q in first if q["sql"].startswith('SELECT "runs_run"."cancel_requested"')
    ]
    assert cancel_reads == []  # the action's write said: not cancelled
    assert ToolCall.objects.get(run=run, call_id="c1").status == "succeeded"
    run = drive_run(run)
    assert (run.status, run.stop_reason) == ("cancelled", "cancelled")
    assert len(asks) == 2 and run.steps == 2  # the second action is on record
    assert ToolCall.objects.get(run=run, call_id="c2").status == "cancelled"
