"""Eval runs through a real Celery worker: every trial is a real run of the
Kettlecraft demo agent, its approval decided by the case's script (nobody
watches), graded when it ends, and the suite's figures stored once all did.
Refused starts write nothing."""

from __future__ import annotations

import io
import uuid
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from approvals.models import ApprovalRequest
from runs.models import EvalRun, EvalTrial, Run
from runs.services import eval_runs
from runs.services.eval_runs import EvalRunRefused, eval_run_start
from runs.services.evals import eval_suite_create
from runs.services.lifecycle import run_start
from tests.conftest import _member, wait_for

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


def test_a_case_input_over_the_run_limit_is_refused_naming_it_and_nothing_written(
    demo_agent, operator_user, settings
):
    settings.RUN_MAX_INPUT_CHARS = 20
    suite = _suite(demo_agent.tenant, operator_user, APPROVED)
    with pytest.raises(EvalRunRefused) as refused:
        eval_run_start(tenant=demo_agent.tenant, suite=suite,
                       agent_slug=demo_agent.slug, k=2, user=operator_user)  # fmt: skip
    assert list(refused.value.problems) == ["cases[approved].input"]
    assert "the limit is 20" in refused.value.problems["cases[approved].input"][0]
    assert not EvalRun.objects.exists() and not Run.objects.exists()


def test_a_start_failing_half_way_cancels_what_it_started_and_fails_the_eval_run(
    demo_agent, operator_user, monkeypatch
):
    """Each case's runs are committed as they start (the workers begin on the
    first case); a failure after the checks leaves no trial waiting."""
    started = []

    def start_then_fail(**kwargs: Any) -> Run:
        if len(started) == 2:
            raise RuntimeError("the database went away")
        started.append(run_start(**kwargs))
        return started[-1]

    monkeypatch.setattr(eval_runs, "run_start", start_then_fail)
    suite = _suite(demo_agent.tenant, operator_user, APPROVED, DENIED)
    with pytest.raises(RuntimeError):
        eval_run_start(tenant=demo_agent.tenant, suite=suite,
                       agent_slug=demo_agent.slug, k=2, user=operator_user)  # fmt: skip
    eval_run = EvalRun.objects.get()
    assert eval_run.status == EvalRun.Status.FAILED
    assert "the database went away" in eval_run.summary["notes"][0]
    assert [r.status for r in Run.objects.filter(id__in=[r.id for r in started])] == [
        Run.Status.CANCELLED,
        Run.Status.CANCELLED,
    ]
    trials = list(EvalTrial.objects.filter(eval_run=eval_run))
    assert len(trials) == 4
    assert all(t.status == EvalTrial.Status.ERROR and t.passed is False for t in trials)


def test_an_unknown_version_is_refused(demo_agent, operator_user):
    suite = _suite(demo_agent.tenant, operator_user, APPROVED)
    with pytest.raises(EvalRunRefused) as refused:
        eval_run_start(tenant=demo_agent.tenant, suite=suite,
                       agent_slug=demo_agent.slug, version=99, k=1,
                       user=operator_user)  # fmt: skip
    assert "no version 99" in refused.value.problems["version"][0]
    assert not EvalRun.objects.exists() and not Run.objects.exists()


def _eval_cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("eval", "run", *args, stdout=out)
    except SystemExit as exited:
        return int(exited.code or 0), out.getvalue()
    return 0, out.getvalue()


def test_the_cli_gate_exits_0_when_met_and_1_when_not_and_writes_junit(
    demo_agent, operator_user, celery_worker_process, tmp_path
):
    _suite(demo_agent.tenant, operator_user, APPROVED, DENIED)
    common = ("kettle", "--agent", f"{demo_agent.slug}@1", "--k", "2",
              "--user", operator_user.username, "--timeout", "120")  # fmt: skip
    junit = tmp_path / "eval.xml"
    code, out = _eval_cli(*common, "--gate", "pass@1>=0.5", "--junit", str(junit))
    assert code == 0, out
    assert "trials 4/4 [####################] 100%  passed 2" in out
    assert any(
        line.startswith("PASS  approved  2/2 passed") for line in out.splitlines()
    )
    assert any(line.startswith("FAIL  denied  0/2 passed") for line in out.splitlines())
    assert "2 cases, 4 trials, k=2: pass@1 0.50" in out
    assert "gate pass@1>=0.5: pass@1 is 0.5 (ok)" in out
    root = ET.parse(junit).getroot()
    assert (root.get("tests"), root.get("failures")) == ("2", "1")
    failed = root.find(".//testcase[@name='denied']/failure")
    assert failed is not None

    code, out = _eval_cli(*common, "--gate", "pass^k>=0.8", "--baseline", "LAST")
    assert code == 1, out
    assert "gate pass^k>=0.8: pass^k is 0.5 (FAILED)" in out
    assert "regression check against" in out and ": ok" in out
    assert out.rstrip().endswith("eval FAILED")
    assert EvalRun.objects.filter(status=EvalRun.Status.FINISHED).count() == 2


def test_a_bad_gate_exits_with_the_parsers_message_before_anything_starts(
    demo_agent, operator_user
):
    _suite(demo_agent.tenant, operator_user, APPROVED)
    with pytest.raises(CommandError) as refused:
        call_command("eval", "run", "kettle", "--agent", demo_agent.slug,
                     "--gate", "pass^k>>0.8", stdout=io.StringIO())  # fmt: skip
    assert "unknown token '>>'" in str(refused.value)
    assert not EvalRun.objects.exists() and not Run.objects.exists()


def test_the_api_starts_an_eval_run_and_reads_its_results(
    demo_agent, operator_user, viewer_user, api_client_for, celery_worker_process
):
    _suite(demo_agent.tenant, operator_user, APPROVED)
    client = api_client_for(operator_user, demo_agent.tenant)
    started = client.post(
        "/api/v1/evals/runs/",
        {"suite": "kettle", "agent": demo_agent.slug, "k": 2},
        format="json",
    )
    assert started.status_code == 201, started.content
    body = started.json()
    assert body["k"] == 2 and body["suite"] == "kettle" and body["version"] == 1
    assert [c["case"] for c in body["cases"]] == ["approved"]
    assert len(body["cases"][0]["trials"]) == 2
    _finished(EvalRun.objects.get(id=body["id"]))
    reader = api_client_for(viewer_user, demo_agent.tenant)
    read = reader.get(f"/api/v1/evals/runs/{body['id']}/")
    assert read.status_code == 200
    data = read.json()
    assert data["status"] == "finished" and data["summary"]["pass_at_1"] == 1.0
    assert data["progress"] == {"done": 2, "total": 2, "passed": 2}
    assert all(t["passed"] and t["run_status"] == "succeeded"
               for t in data["cases"][0]["trials"])  # fmt: skip
    # A viewer may not start one.
    refused = reader.post("/api/v1/evals/runs/",
                          {"suite": "kettle", "agent": demo_agent.slug, "k": 1},
                          format="json")  # fmt: skip
    assert refused.status_code == 403


def test_the_api_refuses_bad_k_naming_it_and_writes_nothing(
    demo_agent, operator_user, api_client_for, other_tenant
):
    _suite(demo_agent.tenant, operator_user, APPROVED)
    client = api_client_for(operator_user, demo_agent.tenant)
    for k in (0, 10000):
        bad = client.post("/api/v1/evals/runs/",
                          {"suite": "kettle", "agent": demo_agent.slug, "k": k},
                          format="json")  # fmt: skip
        assert bad.status_code == 400
        assert list(bad.json()["error"]["fields"]) == ["k"]
    missing = client.post("/api/v1/evals/runs/",
                          {"suite": "nope", "agent": demo_agent.slug, "k": 1},
                          format="json")  # fmt: skip
    assert missing.status_code == 400 and "suite" in missing.json()["error"]["fields"]
    assert not EvalRun.objects.exists() and not Run.objects.exists()
    assert client.get(f"/api/v1/evals/runs/{uuid.uuid4()}/").status_code == 404


def test_an_approval_the_script_does_not_cover_is_denied_not_left_waiting(
    demo_agent, operator_user, celery_worker_process
):
    unscripted = {**APPROVED, "slug": "unscripted", "approvals": []}
    suite = _suite(demo_agent.tenant, operator_user, unscripted)
    eval_run = eval_run_start(
        tenant=demo_agent.tenant, suite=suite, agent_slug=demo_agent.slug, k=1,
        user=operator_user,
    )  # fmt: skip
    _finished(eval_run)
    request = ApprovalRequest.objects.get(run__eval_trial__eval_run=eval_run)
    assert request.status == ApprovalRequest.Status.DENIED
    assert "no scripted decision" in request.reason
    assert EvalTrial.objects.get(eval_run=eval_run).passed is False


def test_another_tenants_eval_run_is_not_found(
    demo_agent, operator_user, api_client_for, other_tenant
):
    suite = _suite(demo_agent.tenant, operator_user, APPROVED)
    eval_run = eval_run_start(
        tenant=demo_agent.tenant, suite=suite, agent_slug=demo_agent.slug, k=1,
        user=operator_user,
    )  # fmt: skip
    stranger = api_client_for(_member(other_tenant, "olga", "admin"), other_tenant)
    assert stranger.get(f"/api/v1/evals/runs/{eval_run.id}/").status_code == 404


def test_a_scripted_edit_changes_what_runs_and_the_grader_sees_it(
    demo_agent, operator_user, celery_worker_process
):
    edited = {
        "slug": "edited",
        "input": INPUT,
        "approvals": [{"tool": "create_replacement", "decision": "edit",
                       "args": {"order_id": "4821", "reason": "photo checked"}}],
        "graders": [{"kind": "args", "tool": "create_replacement",
                     "path": "$.reason", "equals": "photo checked"}],
    }  # fmt: skip
    suite = _suite(demo_agent.tenant, operator_user, edited)
    eval_run = eval_run_start(
        tenant=demo_agent.tenant, suite=suite, agent_slug=demo_agent.slug, k=1,
        user=operator_user,
    )  # fmt: skip
    assert _finished(eval_run).summary["pass_at_1"] == 1.0
    trial = EvalTrial.objects.select_related("run").get(eval_run=eval_run)
    assert trial.run.status == Run.Status.SUCCEEDED
    request = ApprovalRequest.objects.get(run=trial.run)
    assert request.status == ApprovalRequest.Status.APPROVED


def test_a_decision_the_user_may_not_record_cancels_the_trial_instead_of_waiting(
    demo_agent, viewer_user, operator_user, celery_worker_process
):
    # A viewer may not decide approvals (the operator could, so the policy asks):
    # the scripted approve is refused by the decide service, and the trial's run
    # is cancelled rather than left waiting.
    suite = _suite(demo_agent.tenant, viewer_user, APPROVED)
    eval_run = eval_run_start(
        tenant=demo_agent.tenant, suite=suite, agent_slug=demo_agent.slug, k=1,
        user=viewer_user,
    )  # fmt: skip
    assert _finished(eval_run).summary["pass_at_1"] == 0.0
    trial = EvalTrial.objects.select_related("run").get(eval_run=eval_run)
    assert trial.run.status == Run.Status.CANCELLED
    assert trial.status == EvalTrial.Status.ERROR and trial.passed is False
    assert "the scripted approval was refused" in trial.grader_results[0]["reason"]
    assert not ApprovalRequest.objects.filter(
        run=trial.run, status=ApprovalRequest.Status.PENDING
    ).exists()
