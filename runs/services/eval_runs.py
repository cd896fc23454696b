"""Eval runs (docs/evals.md, "Eval runs and the CI command"): a suite tried
against an agent version, k real runs per case, their approvals decided by the
case's script, each graded when it ends, and the suite's figures once all did.

Progress is driven from two places, both idempotent: the step task, right after
a trial's run ends or starts to wait (`eval_trial_after_step`), and a periodic
sweep (`eval_runs_sweep`) for runs that end elsewhere (a cancel, an expired
approval, recovery) or whose step task failed after the step.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.services import AlreadyDecided, ApprovalForbidden, ApprovalInputError
from controlplane.models import Tenant
from controlplane.services import audit_record
from runs.evals.graders import case_grade, graders_check_against
from runs.evals.results import (
    OPEN_TRIALS,
    eval_run_suite_summary,
    summary_document,
)
from runs.evals.selectors import eval_suite_document
from runs.models import Agent, AgentVersion, EvalRun, EvalSuite, EvalTrial, Run
from runs.services.decide import approval_decide
from runs.services.lifecycle import (
    RunConflict,
    run_cancel,
    run_input_problem,
    run_start,
)
from shop.models import ShopWorld
from shop.services import shop_worlds_create

logger = logging.getLogger(__name__)

MAX_K = 100

__all__ = [
    "MAX_K",
    "EvalRunRefused",
    "eval_run_finish_if_done",
    "eval_run_create",
    "eval_run_start",
    "eval_runs_sweep",
    "eval_trial_after_step",
    "eval_trial_grade",
]


class EvalRunRefused(Exception):
    """The eval run cannot start; `problems` names each field. Nothing was written."""

    def __init__(self, problems: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in problems.items()))
        self.problems = problems


def _version_of(tenant: Tenant, agent_slug: str, number: int | None) -> AgentVersion:
    agent = Agent.objects.filter(
        tenant=tenant, slug=agent_slug, deleted_at__isnull=True
    ).first()
    if agent is None:
        raise EvalRunRefused({"agent": [f"no agent {agent_slug!r} in this tenant"]})
    if number is None:
        if agent.current_version_id is None:
            raise EvalRunRefused(
                {"agent": [f"agent {agent_slug!r} has no version run here"]}
            )
        return AgentVersion.objects.select_related("agent").get(
            id=agent.current_version_id
        )
    version = (
        AgentVersion.objects.filter(agent=agent, number=number)
        .select_related("agent")
        .first()
    )
    if version is None:
        raise EvalRunRefused(
            {"version": [f"agent {agent_slug!r} has no version {number}"]}
        )
    return version


def eval_run_create(
    *,
    suite: EvalSuite,
    snapshot: dict[str, Any],
    k: int,
    user: User | None,
    agent_version: AgentVersion | None = None,
    external_agent: str = "",
    notes: list[str] | None = None,
) -> tuple[EvalRun, list[EvalTrial]]:
    """An eval run of a hosted agent version or of an external agent, with its
    k trials per case pending: a hosted trial until its run starts, an
    external one until its client reports it."""
    eval_run = EvalRun.objects.create(
        tenant_id=suite.tenant_id,
        suite=suite,
        agent_version=agent_version,
        external_agent=external_agent,
        k=k,
        status=EvalRun.Status.RUNNING,
        suite_snapshot=snapshot,
        summary={"notes": notes} if notes else {},
        created_by=user,
        started_at=timezone.now(),
    )
    by_slug = {case.slug: case for case in suite.cases.all()}
    trials = EvalTrial.objects.bulk_create(
        EvalTrial(
            eval_run=eval_run,
            case=by_slug.get(case["slug"]),
            case_slug=case["slug"],
            index=index,
            status=EvalTrial.Status.PENDING,
        )
        for case in snapshot["cases"]
        for index in range(k)
    )
    return eval_run, trials


def eval_run_start(
    *,
    tenant: Tenant,
    suite: EvalSuite,
    agent_slug: str,
    version: int | None = None,
    k: int,
    user: User | None,
) -> EvalRun:
    """Start k trials of every case of `suite` against the agent's version (its
    current one by default). Refused (EvalRunRefused) with nothing written when k
    is out of 1..100, the suite has no case, a case's input cannot start a run,
    or a grader or scripted approval names a tool the version lacks.

    The eval run and its trials (pending) are committed first; then each case's
    worlds and runs are committed as they start, so the workers begin on the
    first case while the last is started (an eval run is not finished while a
    trial is pending). A start that fails after the checks cancels what it
    started and fails the eval run, saying why."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise EvalRunRefused({"k": [f"k must be between 1 and {MAX_K}, not {k!r}"]})
    if suite.tenant_id != tenant.id:
        raise EvalRunRefused({"suite": ["no such suite in this tenant"]})
    snapshot = eval_suite_document(suite=suite)
    cases = snapshot["cases"]
    if not cases:
        raise EvalRunRefused({"suite": [f"suite {suite.slug} has no cases"]})
    agent_version = _version_of(tenant, agent_slug, version)
    problems = graders_check_against(agent_version, cases)
    for case in cases:
        refused = run_input_problem(case["input"])
        if refused:
            problems[f"cases[{case['slug']}].input"] = [refused]
    if problems:
        raise EvalRunRefused(problems)
    with transaction.atomic():
        eval_run, trials = eval_run_create(
            suite=suite, snapshot=snapshot, k=k, user=user, agent_version=agent_version
        )
        audit_record(
            tenant=tenant,
            actor=user,
            action="eval_run.start",
            object_type="eval_run",
            object_id=str(eval_run.id),
            after={
                "suite": suite.slug,
                "agent": agent_slug,
                "version": agent_version.number,
                "k": k,
            },
        )
    try:
        for at, case in enumerate(cases):
            with transaction.atomic():
                worlds = _trial_worlds(tenant, eval_run, case, k)
                for index, world in enumerate(worlds):
                    run = run_start(
                        tenant=tenant,
                        agent_slug=agent_slug,
                        input=case["input"],
                        started_by=user,
                        version=agent_version,
                        world_id=None if world is None else world.id,
                        # Each trial its own end user: a fresh memory, and the
                        # per-end-user budget limits hold it like any user.
                        end_user=f"eval-trial:{trials[at * k + index].id}",
                    )
                    EvalTrial.objects.filter(id=trials[at * k + index].id).update(
                        run=run, status=EvalTrial.Status.RUNNING
                    )
    except Exception as failure:
        _eval_run_abandon(eval_run, f"a trial could not be started: {failure}")
        raise
    # A trial that ended at once (refused by the runs-per-period budget) is
    # graded now, like any other.
    transaction.on_commit(lambda: eval_runs_sweep(eval_run_id=eval_run.id))
    return eval_run


def _eval_run_abandon(eval_run: EvalRun, why: str) -> None:
    """A start that failed half-way: its runs cancelled, its trials and the
    eval run failed with the reason (no trial is left waiting)."""
    logger.exception("eval run %s: %s", eval_run.id, why)
    for run in Run.objects.filter(eval_trial__eval_run=eval_run):
        with suppress(RunConflict):
            run_cancel(run=run, actor=None)
    EvalTrial.objects.filter(eval_run=eval_run, status__in=OPEN_TRIALS).update(
        status=EvalTrial.Status.ERROR,
        passed=False,
        grader_results=[
            {"kind": "start", "passed": False, "error": True, "reason": why}
        ],  # fmt: skip
        graded_at=timezone.now(),
    )
    EvalRun.objects.filter(id=eval_run.id).update(
        status=EvalRun.Status.FAILED, summary={"notes": [why]},
        finished_at=timezone.now(),
    )  # fmt: skip


def _trial_worlds(
    tenant: Tenant, eval_run: EvalRun, case: dict[str, Any], k: int
) -> list[ShopWorld | None]:
    """A fresh shop for each trial of a case that sets up a world: its orders
    exactly as the case says, seen and changed by that trial's run alone."""
    if not case["world"]:
        return [None] * k
    worlds = shop_worlds_create(
        tenant=tenant,
        orders=case["world"].get("orders", []),
        labels=[f"eval run {eval_run.id} {case['slug']} #{i}" for i in range(k)],
    )
    return list(worlds)


def _case_of(eval_run: EvalRun, slug: str) -> dict[str, Any]:
    for case in eval_run.suite_snapshot.get("cases", []):
        if case["slug"] == slug:
            return dict(case)
    raise KeyError(slug)


def eval_trial_after_step(*, run_id: Any) -> None:
    """A step of `run_id` ended (finished or waiting): if it is an eval trial,
    decide its waiting approvals by script, or grade it."""
    trial = EvalTrial.objects.filter(run_id=run_id).select_related("run").first()
    if trial is None or trial.status not in OPEN_TRIALS or trial.run is None:
        return
    _trial_advance(trial)


def _trial_advance(trial: EvalTrial) -> None:
    run = trial.run
    assert run is not None
    if run.status == Run.Status.WAITING_APPROVAL:
        _approvals_script(trial)
        run.refresh_from_db()  # a refused decision cancelled it: grade it now
    if run.is_terminal:
        eval_trial_grade(trial_id=trial.id)
        eval_run_finish_if_done(eval_run_id=trial.eval_run_id)


def _approvals_script(trial: EvalTrial) -> None:
    """Decide the run's pending approvals as the case's script says, through the
    normal decide service, as the user who started the eval run. A request the
    script does not cover is denied (nobody is watching a suite); one that cannot
    be decided (that user may not, an edit the policy refuses) cancels the run,
    so no trial waits for a human."""
    eval_run = EvalRun.objects.get(id=trial.eval_run_id)
    script = _case_of(eval_run, trial.case_slug).get("approvals") or []
    decider = eval_run.created_by
    assert trial.run_id is not None  # only a trial with a run waits
    pending = ApprovalRequest.objects.filter(
        run_id=trial.run_id, status=ApprovalRequest.Status.PENDING
    )
    for request in pending:
        entry = next(
            (
                e
                for e in script
                if request.kind == ApprovalRequest.Kind.TOOL_CALL
                and e["tool"] == request.tool_name
            ),
            None,
        )
        if entry is None:
            approve, args = False, None
            reason = f"eval case {trial.case_slug} has no scripted decision for this"
        else:
            approve = entry["decision"] != "deny"
            args = entry.get("args") if entry["decision"] == "edit" else None
            reason = entry.get("reason") or (
                f"scripted by eval case {trial.case_slug}: {entry['decision']}"
            )
        try:
            if decider is None:
                raise ApprovalForbidden("the eval run's user no longer exists")
            approval_decide(
                request=request, decided_by=decider, approve=approve,
                reason=reason, args=args,
            )  # fmt: skip
        except AlreadyDecided:
            continue
        except (ApprovalForbidden, ApprovalInputError) as refused:
            _trial_cancel(trial, f"the scripted approval was refused: {refused}")
            return


def _trial_cancel(trial: EvalTrial, why: str) -> None:
    assert trial.run_id is not None
    run = Run.objects.get(id=trial.run_id)
    logger.warning("eval trial %s: %s; its run is cancelled", trial.id, why)
    EvalTrial.objects.filter(id=trial.id).update(
        grader_results=[
            {"kind": "approvals", "passed": False, "reason": why, "error": True}
        ]
    )
    with suppress(RunConflict):  # it ended meanwhile; grading reads how
        run_cancel(run=run, actor=None)


def eval_trial_grade(*, trial_id: Any) -> None:
    """Grade a trial whose run ended; a trial already graded is left as it is."""
    trial = EvalTrial.objects.select_related("run", "eval_run").get(id=trial_id)
    if trial.status not in OPEN_TRIALS:
        return
    run = trial.run
    if run is not None and not run.is_terminal:
        return
    if run is None:  # its run was deleted (retention): nothing to judge
        passed, error = False, True
        results = [{"kind": "run", "passed": False, "reason": "the run is gone",
                    "error": True}]  # fmt: skip
    else:
        graders = _case_of(trial.eval_run, trial.case_slug)["graders"]
        verdict = case_grade(run=run, graders=graders)
        passed, error = verdict.passed, verdict.error
        results = [r.to_dict() for r in verdict.results]
        # A refused scripted approval (recorded before the cancel) stays in the
        # results: it is why the trial failed.
        earlier = [r for r in trial.grader_results if r.get("kind") == "approvals"]
        if earlier:
            passed, error, results = False, True, earlier + results
    EvalTrial.objects.filter(id=trial.id, status__in=OPEN_TRIALS).update(
        status=EvalTrial.Status.ERROR if error else EvalTrial.Status.GRADED,
        passed=passed,
        grader_results=results,
        graded_at=timezone.now(),
    )


def eval_run_finish_if_done(*, eval_run_id: Any) -> bool:
    """Once every trial is graded: the suite's figures into the summary, and the
    eval run finished. Returns whether this call finished it."""
    if EvalTrial.objects.filter(
        eval_run_id=eval_run_id, status__in=OPEN_TRIALS
    ).exists():
        return False
    eval_run = EvalRun.objects.get(id=eval_run_id)
    if eval_run.status != EvalRun.Status.RUNNING:
        return False
    summary = eval_run_suite_summary(eval_run)
    document: dict[str, Any] = dict(eval_run.summary)
    if summary is not None:
        document.update(summary_document(summary))
    return bool(
        EvalRun.objects.filter(id=eval_run_id, status=EvalRun.Status.RUNNING).update(
            status=EvalRun.Status.FINISHED,
            summary=document,
            finished_at=timezone.now(),
        )
    )


def eval_runs_sweep(*, eval_run_id: Any = None, limit: int = 500) -> int:
    """Advance open trials whose run ended or waits for an approval, and finish
    eval runs that are done; returns how many trials it moved on."""
    trials = EvalTrial.objects.filter(
        status__in=OPEN_TRIALS, eval_run__status=EvalRun.Status.RUNNING
    ).select_related("run")
    if eval_run_id is not None:
        trials = trials.filter(eval_run_id=eval_run_id)
    moved = 0
    eval_runs = set()
    for trial in trials[:limit]:
        eval_runs.add(trial.eval_run_id)
        run = trial.run
        if run is None and trial.status == EvalTrial.Status.PENDING:
            continue  # an external agent's trial its client has not reported
        if run is None or run.is_terminal or run.status == Run.Status.WAITING_APPROVAL:
            if run is None:
                eval_trial_grade(trial_id=trial.id)
            else:
                _trial_advance(trial)
            moved += 1
    for finished in eval_runs:
        eval_run_finish_if_done(eval_run_id=finished)
    if eval_run_id is not None:
        eval_run_finish_if_done(eval_run_id=eval_run_id)
    return moved
