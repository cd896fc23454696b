"""Reads of eval runs: their trials as `TrialOutcome`s and the suite figures
computed from them (runs.engine.eval_metrics), always scoped to a tenant."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import QuerySet

from controlplane.models import Tenant
from runs.engine.eval_metrics import SuiteSummary, TrialOutcome, summarise_suite
from runs.models import EvalRun, EvalTrial

__all__ = [
    "eval_run_get_for",
    "eval_run_latest_finished",
    "eval_run_outcomes",
    "eval_run_progress",
    "eval_run_suite_summary",
    "summary_document",
]

OPEN_TRIALS = (EvalTrial.Status.PENDING, EvalTrial.Status.RUNNING)


def eval_run_get_for(*, tenant: Tenant, eval_run_id: Any) -> EvalRun | None:
    return (
        EvalRun.objects.filter(tenant=tenant, id=eval_run_id)
        .select_related("suite", "agent_version__agent")
        .first()
    )


def eval_run_latest_finished(
    *, tenant: Tenant, suite_id: Any, agent_id: Any, exclude: Any = None
) -> EvalRun | None:
    """The newest finished eval run of this suite and agent (any version): the
    CLI's `--baseline LAST`."""
    runs = EvalRun.objects.filter(
        tenant=tenant,
        suite_id=suite_id,
        agent_version__agent_id=agent_id,
        status=EvalRun.Status.FINISHED,
    )
    if exclude is not None:
        runs = runs.exclude(id=exclude)
    return runs.order_by("-finished_at", "-created_at").first()


def eval_run_trials(eval_run: EvalRun) -> QuerySet[EvalTrial]:
    return EvalTrial.objects.filter(eval_run=eval_run).select_related("run")


def eval_run_progress(eval_run: EvalRun) -> tuple[int, int, int]:
    """(trials ended and graded, trials in all, trials passed)."""
    trials = list(eval_run_trials(eval_run).values_list("status", "passed"))
    done = sum(1 for status, _ in trials if status not in OPEN_TRIALS)
    passed = sum(1 for status, ok in trials if status not in OPEN_TRIALS and ok)
    return done, len(trials), passed


def _case_order(eval_run: EvalRun) -> dict[str, int]:
    cases = eval_run.suite_snapshot.get("cases", [])
    return {str(case["slug"]): i for i, case in enumerate(cases)}


def eval_run_outcomes(eval_run: EvalRun) -> list[TrialOutcome]:
    """The ended trials, in the suite's case order then trial index. A trial
    whose grader could not judge counts as failed, with that reason."""
    order = _case_order(eval_run)
    trials = sorted(
        (t for t in eval_run_trials(eval_run) if t.status not in OPEN_TRIALS),
        key=lambda t: (order.get(t.case_slug, len(order)), t.index),
    )
    outcomes = []
    for trial in trials:
        run = trial.run
        latency = 0.0
        tokens = steps = 0
        cost = Decimal(0)
        if run is not None:
            begun = run.started_at or run.created_at
            if run.finished_at is not None:
                latency = (run.finished_at - begun).total_seconds() * 1000
            tokens = run.input_tokens + run.output_tokens
            steps = run.steps
            cost = run.cost
        outcomes.append(
            TrialOutcome(
                case_id=trial.case_slug,
                passed=bool(trial.passed),
                cost=cost,
                tokens=tokens,
                steps=steps,
                latency_ms=latency,
                reasons=tuple(
                    str(r.get("reason", ""))
                    for r in trial.grader_results
                    if not r.get("passed")
                ),
                trial_id=str(trial.id),
            )
        )
    return outcomes


def eval_run_suite_summary(eval_run: EvalRun) -> SuiteSummary | None:
    """The figures of an eval run's ended trials; None before any ended."""
    outcomes = eval_run_outcomes(eval_run)
    if not outcomes:
        return None
    # A case with fewer ended trials than k (a run still going) is summarised
    # at the k its trials allow.
    least = min(
        sum(1 for o in outcomes if o.case_id == case)
        for case in {o.case_id for o in outcomes}
    )
    return summarise_suite(outcomes, k=min(eval_run.k, least))


def summary_document(summary: SuiteSummary) -> dict[str, Any]:
    """A suite summary as JSON (costs as decimal strings)."""
    interval = summary.pass_at_1_interval
    return {
        "k": summary.k,
        "trials": summary.trials,
        "pass_at_1": summary.pass_at_1,
        "pass_at_k": summary.pass_at_k,
        "pass_hat_k": summary.pass_hat_k,
        "pass_at_1_interval": {
            "low": interval.low,
            "high": interval.high,
            "confidence": interval.confidence,
        },
        "effective_trials": summary.effective_trials,
        "mean_cost": str(summary.mean_cost),
        "total_cost": str(summary.total_cost),
        "mean_tokens": summary.mean_tokens,
        "mean_steps": summary.mean_steps,
        "mean_latency_ms": summary.mean_latency_ms,
        "cases": [
            {
                "case": case.case_id,
                "n": case.n,
                "passed": case.c,
                "pass_at_1": case.pass_at_1,
                "pass_at_k": case.pass_at_k,
                "pass_hat_k": case.pass_hat_k,
                "mean_cost": str(case.mean_cost),
                "mean_tokens": case.mean_tokens,
                "mean_steps": case.mean_steps,
                "mean_latency_ms": case.mean_latency_ms,
            }
            for case in summary.cases
        ],
    }
