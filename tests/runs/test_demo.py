"""The Kettlecraft demo works every time: approved or denied, on a fresh or a used
database, and its replay agrees with the record."""

from __future__ import annotations

from typing import Any

from approvals.models import ApprovalRequest
from runs.models import Run
from runs.replay import run_replay
from runs.services import run_start
from runs.services.decide import approval_decide
from shop.models import Replacement


def _demo_run(agent: Any, user: Any, drive_run: Any, *, approve: bool) -> Run:
    run = run_start(
        tenant=agent.tenant,
        agent_slug=agent.slug,
        input="order 4821 arrived damaged",
        started_by=user,
    )
    run = drive_run(run)
    assert run.status == Run.Status.WAITING_APPROVAL
    approval_decide(
        request=ApprovalRequest.objects.get(run=run),
        decided_by=user,
        approve=approve,
        reason="" if approve else "the customer already has a refund",
    )
    return drive_run(run)


def test_every_approved_demo_run_succeeds_on_a_used_database(
    demo_agent, operator_user, drive_run
):
    for attempt in range(3):
        run = _demo_run(demo_agent, operator_user, drive_run, approve=True)
        assert run.status == Run.Status.SUCCEEDED, (attempt, run.evaluation)
        assert run.evaluation["verdict"] == "passed"
        assert Replacement.objects.count() == attempt + 1


def test_the_deny_path_answers_truthfully_and_says_why_it_failed(
    demo_agent, operator_user, drive_run
):
    run = _demo_run(demo_agent, operator_user, drive_run, approve=False)
    assert Replacement.objects.count() == 0
    assert run.status == Run.Status.FAILED
    answer = run.final_answer
    assert "on its way" not in answer
    assert "could not ship a replacement" in answer
    assert "the customer already has a refund" in answer
    assert "no replacement was shipped" in run.evaluation["reason"]
    assert "the customer already has a refund" in run.evaluation["reason"]
    # A deny after an approved run of the same order still judges only this run.
    approved = _demo_run(demo_agent, operator_user, drive_run, approve=True)
    assert approved.status == Run.Status.SUCCEEDED
    again = _demo_run(demo_agent, operator_user, drive_run, approve=False)
    assert again.status == Run.Status.FAILED


def test_replay_judges_with_the_evaluator_from_recorded_observations(
    demo_agent, operator_user, drive_run
):
    approved = _demo_run(demo_agent, operator_user, drive_run, approve=True)
    denied = _demo_run(demo_agent, operator_user, drive_run, approve=False)
    # The live world changes after the runs; the replay reads only the record.
    Replacement.objects.all().delete()
    for run in (approved, denied):
        report = run_replay(run=run)
        assert report.matches, report.lines
        assert report.lines[-1] == f"same status {run.status}"
