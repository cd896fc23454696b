"""Eval runs of an agent that runs outside (docs/evals.md, "Agents that run
outside"): the trials have no hosted run. The client runs each case's input
through its own agent under a fresh trace, the agent's spans arrive over OTLP as
an external run, and the client reports the trial with that trace id; the trial
is bound to the external run and graded from its spans.

Scripted approvals are not applied to external trials: the agent's gates wait
in its own process for a decision, so a suite with scripted approvals is refused
for an external agent rather than left to block on a person.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from controlplane.models import Tenant
from controlplane.services import audit_record
from runs.evals.graders import judge_endpoint_problems
from runs.evals.selectors import eval_suite_document
from runs.models import EvalRun, EvalSuite, EvalTrial, Run
from runs.services.eval_runs import (
    MAX_K,
    EvalRunRefused,
    eval_run_create,
    eval_run_finish_if_done,
    eval_trial_grade,
)
from runs.services.external import EXTERNAL_STOP_REASON, run_external_update

__all__ = [
    "EvalTrialConflict",
    "eval_run_start_external",
    "eval_trial_report",
]

MAX_ERROR_CHARS = 2000


class EvalTrialConflict(Exception):
    """A report that cannot apply (a 409): `code` says why. Nothing was written."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@transaction.atomic
def eval_run_start_external(
    *, tenant: Tenant, suite: EvalSuite, agent_name: str, k: int, user: User | None
) -> EvalRun:
    """An eval run of `suite` for the external agent `agent_name`: k pending
    trials per case for its client to run and report. Refused (EvalRunRefused)
    with nothing written when k is out of 1..100, the suite has no case, a case
    scripts approvals, or a judge endpoint cannot judge."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise EvalRunRefused({"k": [f"k must be between 1 and {MAX_K}, not {k!r}"]})
    if suite.tenant_id != tenant.id:
        raise EvalRunRefused({"suite": ["no such suite in this tenant"]})
    snapshot = eval_suite_document(suite=suite)
    cases = snapshot["cases"]
    if not cases:
        raise EvalRunRefused({"suite": [f"suite {suite.slug} has no cases"]})
    problems = judge_endpoint_problems(tenant.id, cases)
    for i, case in enumerate(cases):
        if case.get("approvals"):
            problems[f"cases[{i}].approvals"] = [
                f"case {case['slug']} scripts approval decisions, which an agent "
                "that runs outside cannot follow (its gates wait for a person); "
                "run this suite against a hosted agent or drop the approvals"
            ]
    if problems:
        raise EvalRunRefused(problems)
    notes = [
        f"case {case['slug']}: world setup is not applied to an agent that runs outside"
        for case in cases
        if case["world"]
    ]
    eval_run, _ = eval_run_create(
        suite=suite, snapshot=snapshot, k=k, user=user, external_agent=agent_name,
        notes=notes,
    )  # fmt: skip
    audit_record(
        tenant=tenant,
        actor=user,
        action="eval_run.start",
        object_type="eval_run",
        object_id=str(eval_run.id),
        after={"suite": suite.slug, "external_agent": agent_name, "k": k},
    )
    return eval_run


def eval_trial_report(
    *,
    tenant: Tenant,
    eval_run: EvalRun,
    trial_id: Any,
    trace_id: str | None = None,
    final_answer: str | None = None,
    error: str | None = None,
) -> EvalTrial:
    """The client ran the trial: bind it to the external run of `trace_id` and
    grade it, or (`error`, the agent produced no trace) record it as failed.
    EvalTrialConflict (nothing written) for a trial already reported, a trace
    that is another tenant's, a native run's, not arrived, or another trial's."""
    with transaction.atomic():
        trial = (
            EvalTrial.objects.select_for_update()
            .filter(eval_run=eval_run, id=trial_id)
            .first()
        )
        if trial is None:
            raise EvalTrialConflict("no_such_trial", f"no trial {trial_id}")
        if eval_run.agent_version_id is not None:
            raise EvalTrialConflict(
                "hosted_eval_run",
                "this eval run's trials are hosted runs; only an external "
                "agent's trials are reported",
            )
        if trial.status != EvalTrial.Status.PENDING:
            raise EvalTrialConflict(
                "already_reported", f"trial {trial.id} was already reported"
            )
        if eval_run.status != EvalRun.Status.RUNNING:
            raise EvalTrialConflict(
                "eval_run_not_running", f"the eval run is {eval_run.status}"
            )
        if error is not None:
            EvalTrial.objects.filter(id=trial.id).update(
                status=EvalTrial.Status.ERROR,
                passed=False,
                grader_results=[
                    {
                        "kind": "agent",
                        "passed": False,
                        "error": True,
                        "reason": f"the agent failed: {error[:MAX_ERROR_CHARS]}",
                    }
                ],  # fmt: skip
                graded_at=timezone.now(),
            )
        else:
            assert trace_id is not None
            run = _external_run_of(tenant, trace_id)
            case = _case_input(eval_run, trial.case_slug)
            # The task the agent was given, and its answer when its spans did
            # not carry one: what a grader and a person reading the run see.
            run_external_update(
                run=run,
                input=case if not run.input else None,
                final_answer=final_answer if not run.final_answer else None,
            )
            EvalTrial.objects.filter(id=trial.id).update(
                run=run, status=EvalTrial.Status.RUNNING
            )
    if error is None:
        # Graded outside the lock: an LLM judge may take its time.
        eval_trial_grade(trial_id=trial.id)
    eval_run_finish_if_done(eval_run_id=eval_run.id)
    return EvalTrial.objects.select_related("run").get(id=trial.id)


def _external_run_of(tenant: Tenant, trace_id: str) -> Run:
    if Run.objects.filter(trace_id=trace_id).exclude(tenant=tenant).exists():
        raise EvalTrialConflict(
            "trace_unavailable",
            f"trace {trace_id} cannot be used by this tenant: report the trace "
            "id of your own agent's run",
        )
    run = Run.objects.filter(tenant=tenant, trace_id=trace_id).first()
    if run is None:
        raise EvalTrialConflict(
            "trace_not_found",
            f"no span of trace {trace_id} has arrived: the agent must send its "
            "spans to /v1/traces (and flush them) before the trial is reported",
        )
    if run.stop_reason != EXTERNAL_STOP_REASON:
        raise EvalTrialConflict(
            "trace_of_native_run",
            f"trace {trace_id} is a run of this control plane, not an external agent's",
        )
    if EvalTrial.objects.filter(run=run).exists():
        raise EvalTrialConflict(
            "trace_already_reported",
            f"trace {trace_id} was reported for another trial: each trial runs "
            "under a fresh trace",
        )
    return run


def _case_input(eval_run: EvalRun, slug: str) -> str:
    for case in eval_run.suite_snapshot.get("cases", []):
        if case["slug"] == slug:
            return str(case["input"])
    return ""
