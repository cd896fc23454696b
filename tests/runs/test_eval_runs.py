"""Eval runs through a real Celery worker: every trial is a real run of the
Kettlecraft demo agent, its approval decided by the case's script (nobody
watches), graded when it ends, and the suite's figures stored once all did.
Refused starts write nothing."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalRequest
from runs.models import EvalRun, EvalTrial, Run
from runs.services.eval_runs import EvalRunRefused, eval_run_start
from runs.services.evals import eval_suite_create
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

INPUT = "Order #4821 arrived with a dented spout."


def _suite(tenant: Any, user: Any, *cases: dict[str, Any]) -> Any:
    return eval_suite_create(
        tenant=tenant,
        actor=user,
        document={"slug": "kettle", "name": "Kettle", "cases": list(cases)},
    )


APPROVED = {
    "slug": "approved",
    "input": INPUT,
    "approvals": [{"tool": "create_replacement", "decision": "approve"}],
    "graders": [
        {"kind": "must_call", "tool": "create_replacement", "status": "succeeded"}
    ],
}
DENIED = {
    "slug": "denied",
    "input": INPUT,
    "approvals": [
        {
            "tool": "create_replacement",
            "decision": "deny",
            "reason": "ask for a photo first",
        }
    ],  # fmt: skip
    # Fails on purpose: a deny never lets the replacement succeed.
    "graders": [
        {"kind": "must_call", "tool": "create_replacement", "status": "succeeded"}
    ],
}


def _finished(eval_run: EvalRun, timeout: float = 90) -> EvalRun:
    def done() -> EvalRun | None:
        fresh = EvalRun.objects.get(id=eval_run.id)
        return fresh if fresh.status == EvalRun.Status.FINISHED else None

    return wait_for(done, timeout=timeout, what="the eval run to finish")


def test_an_eval_run_through_a_worker_grades_every_trial_and_summarises(
    demo_agent, operator_user, celery_worker_process
):
    suite = _suite(demo_agent.tenant, operator_user, APPROVED, DENIED)
    eval_run = eval_run_start(
        tenant=demo_agent.tenant, suite=suite, agent_slug=demo_agent.slug, k=2,
        user=operator_user,
    )  # fmt: skip
    assert eval_run.suite_snapshot["cases"][0]["slug"] == "approved"
    finished = _finished(eval_run)
    trials = list(EvalTrial.objects.filter(eval_run=eval_run).select_related("run"))
    assert len(trials) == 4
    assert all(t.status == EvalTrial.Status.GRADED for t in trials)
    assert {t.run.agent_version_id for t in trials} == {eval_run.agent_version_id}
    by_case = {
        s: [t for t in trials if t.case_slug == s] for s in ("approved", "denied")
    }
    assert all(t.passed and t.run.status == Run.Status.SUCCEEDED
               for t in by_case["approved"])  # fmt: skip
    # The deny ended unattended: decided by script, the run failed, no request waits.
    assert all(t.passed is False and t.run.status == Run.Status.FAILED
               for t in by_case["denied"])  # fmt: skip
    assert (
        "never called create_replacement"
        in by_case["denied"][0].grader_results[0]["reason"]
    )
    requests = ApprovalRequest.objects.filter(run__eval_trial__eval_run=eval_run)
    assert requests.count() == 4
    assert not requests.filter(status=ApprovalRequest.Status.PENDING).exists()
    assert requests.filter(status=ApprovalRequest.Status.DENIED).count() == 2
    summary = finished.summary
    assert summary["pass_at_1"] == 0.5
    assert summary["pass_at_k"] == 0.5 and summary["pass_hat_k"] == 0.5
    assert summary["trials"] == 4
    low, high = (summary["pass_at_1_interval"][x] for x in ("low", "high"))
    assert 0 < low < 0.5 < high < 1
    assert [c["case"] for c in summary["cases"]] == ["approved", "denied"]
    assert summary["mean_steps"] > 0 and summary["mean_tokens"] > 0


@pytest.mark.parametrize("k", [0, 10000, -1, 101])
def test_k_out_of_range_is_refused_naming_k_and_nothing_is_written(
    demo_agent, operator_user, k
):
    suite = _suite(demo_agent.tenant, operator_user, APPROVED)
    runs_before = Run.objects.count()
    with pytest.raises(EvalRunRefused) as refused:
        eval_run_start(tenant=demo_agent.tenant, suite=suite,
                       agent_slug=demo_agent.slug, k=k, user=operator_user)  # fmt: skip
    assert list(refused.value.problems) == ["k"]
    assert "between 1 and 100" in refused.value.problems["k"][0]
    assert not EvalRun.objects.exists() and not EvalTrial.objects.exists()
    assert Run.objects.count() == runs_before


def test_an_empty_suite_is_refused_and_nothing_is_written(demo_agent, operator_user):
    suite = _suite(demo_agent.tenant, operator_user, APPROVED)
    suite.cases.all().delete()  # the API keeps one; a raw delete does not
    with pytest.raises(EvalRunRefused) as refused:
        eval_run_start(tenant=demo_agent.tenant, suite=suite,
                       agent_slug=demo_agent.slug, k=2, user=operator_user)  # fmt: skip
    assert refused.value.problems == {"suite": ["suite kettle has no cases"]}
    assert not EvalRun.objects.exists() and not Run.objects.exists()


def test_a_grader_naming_a_tool_the_agent_lacks_is_refused_and_nothing_written(
    demo_agent, operator_user
):
    case = {**APPROVED, "graders": [{"kind": "must_call", "tool": "teleport"}]}
    suite = _suite(demo_agent.tenant, operator_user, case)
    with pytest.raises(EvalRunRefused) as refused:
        eval_run_start(tenant=demo_agent.tenant, suite=suite,
                       agent_slug=demo_agent.slug, k=2, user=operator_user)  # fmt: skip
    assert "'teleport'" in refused.value.problems["cases[0].graders[0].tool"][0]
    assert not EvalRun.objects.exists() and not Run.objects.exists()


def test_an_unknown_version_is_refused(demo_agent, operator_user):
    suite = _suite(demo_agent.tenant, operator_user, APPROVED)
    with pytest.raises(EvalRunRefused) as refused:
        eval_run_start(tenant=demo_agent.tenant, suite=suite,
                       agent_slug=demo_agent.slug, version=99, k=1,
                       user=operator_user)  # fmt: skip
    assert "no version 99" in refused.value.problems["version"][0]
    assert not EvalRun.objects.exists() and not Run.objects.exists()
