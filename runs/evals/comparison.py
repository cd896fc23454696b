"""Two eval runs of one suite compared, for the screen a team reads before
shipping (docs/evals.md "Comparing two eval runs").

The statistics are `runs.engine.eval_comparison.compare_suites` over the two
runs' trials as graded (`eval_run_suite_summary`); this module only reads the
rows, refuses what cannot be compared, and adds what the engine does not know:
for every flipped case the pair of trial runs to open in the run diff (a
passing trial of the run where it passed against a failing one of the run where
it failed, the lowest trial index of each)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from controlplane.models import Tenant
from runs.engine.eval_comparison import (
    CaseFlip,
    Flip,
    MetricDelta,
    SuiteComparison,
    compare_suites,
)
from runs.evals.history import eval_run_identity
from runs.evals.results import (
    eval_run_get_for,
    eval_run_progress,
    eval_run_suite_summary,
    eval_run_trials,
)
from runs.models import EvalRun

__all__ = ["EvalComparisonRefused", "eval_run_comparison"]

Side = Literal["before", "after"]


class EvalComparisonRefused(Exception):
    """Why two eval runs are not compared: `kind` is not_found (a side is not
    the tenant's), invalid (they cannot be compared) or not_finished."""

    def __init__(
        self,
        kind: Literal["not_found", "invalid", "not_finished"],
        message: str,
        side: Side | None = None,
        status: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.side = side
        self.message = message
        self.status = status  # not_finished: the eval run's status


@dataclass(frozen=True)
class _Trial:
    index: int
    passed: bool
    run_id: str | None
    status: str


def _trials_by_case(eval_run: EvalRun) -> dict[str, list[_Trial]]:
    by_case: dict[str, list[_Trial]] = {}
    for trial in eval_run_trials(eval_run).order_by("case_slug", "index"):
        by_case.setdefault(trial.case_slug, []).append(
            _Trial(
                index=trial.index,
                passed=bool(trial.passed),
                run_id=str(trial.run_id) if trial.run_id else None,
                status=trial.status,
            )
        )
    return by_case


def _first_run(trials: list[_Trial], passed: bool) -> str | None:
    return next((t.run_id for t in trials if t.passed is passed and t.run_id), None)


def _diff_pair(
    flip: CaseFlip, before: list[_Trial], after: list[_Trial]
) -> dict[str, str] | None:
    """Which two trial runs show the flip: the good one on the left."""
    was_passing = flip.direction is Flip.REGRESSED
    before_run = _first_run(before, was_passing)
    after_run = _first_run(after, not was_passing)
    if before_run is None or after_run is None:  # a trial's run was deleted
        return None
    return {"before_run": before_run, "after_run": after_run}


def _delta(delta: MetricDelta) -> dict[str, Any]:
    interval = delta.interval
    return {
        "before": delta.before,
        "after": delta.after,
        "delta": delta.delta,
        "interval": None
        if interval is None
        else {
            "low": interval.low,
            "high": interval.high,
            "confidence": interval.confidence,
        },
    }


def _side(eval_run: EvalRun) -> dict[str, Any]:
    done, total, passed = eval_run_progress(eval_run)
    return {
        **eval_run_identity(eval_run),
        "trials": total,
        "passed": passed,
    }


def _case_trials(trials: list[_Trial]) -> list[dict[str, Any]]:
    return [
        {"index": t.index, "run": t.run_id, "passed": t.passed, "status": t.status}
        for t in trials
    ]


def _document(
    before: EvalRun, after: EvalRun, comparison: SuiteComparison
) -> dict[str, Any]:
    before_trials = _trials_by_case(before)
    after_trials = _trials_by_case(after)
    flips = {flip.case_id: flip for flip in comparison.flips}
    cases = []
    for case_id in comparison.cases_compared:
        flip = flips.get(case_id)
        b, a = before_trials.get(case_id, []), after_trials.get(case_id, [])
        cases.append(
            {
                "case": case_id,
                "before": {
                    "passed": sum(t.passed for t in b),
                    "trials": len(b),
                    "pass_at_1": sum(t.passed for t in b) / len(b) if b else 0.0,
                    "runs": _case_trials(b),
                },
                "after": {
                    "passed": sum(t.passed for t in a),
                    "trials": len(a),
                    "pass_at_1": sum(t.passed for t in a) / len(a) if a else 0.0,
                    "runs": _case_trials(a),
                },
                "flip": flip.direction.value if flip else None,
            }
        )
    return {
        "suite": before.suite.slug,
        "before": _side(before),
        "after": _side(after),
        "k": comparison.k,
        "confidence": comparison.confidence,
        "power": comparison.power,
        "flip_threshold": comparison.flip_threshold,
        "trials_per_case": comparison.trials_per_case,
        "cases_compared": len(comparison.cases_compared),
        "cases_added": list(comparison.cases_added),
        "cases_removed": list(comparison.cases_removed),
        "flips": [
            {
                "case": flip.case_id,
                "direction": flip.direction.value,
                "before_pass_at_1": flip.before,
                "after_pass_at_1": flip.after,
                "diff": _diff_pair(
                    flip,
                    before_trials.get(flip.case_id, []),
                    after_trials.get(flip.case_id, []),
                ),
            }
            for flip in comparison.flips
        ],
        "metrics": {
            "pass_at_1": _delta(comparison.pass_at_1),
            "pass_at_k": _delta(comparison.pass_at_k),
            "pass_hat_k": _delta(comparison.pass_hat_k),
            "cost": _delta(comparison.cost),
            "latency_ms": _delta(comparison.latency_ms),
            "tokens": _delta(comparison.tokens),
            "steps": _delta(comparison.steps),
        },
        "minimum_detectable_difference": comparison.minimum_detectable_difference,
        "warning": comparison.warning,
        "cases": cases,
    }


def _get(tenant: Tenant, eval_run_id: Any, side: Side) -> EvalRun:
    eval_run = eval_run_get_for(tenant=tenant, eval_run_id=eval_run_id)
    if eval_run is None:
        raise EvalComparisonRefused(
            "not_found", f"No such eval run in this tenant: the {side} one.", side
        )
    return eval_run


def eval_run_comparison(
    *, tenant: Tenant, before_id: Any, after_id: Any
) -> dict[str, Any]:
    """`after` against `before` (deltas are after − before), both of `tenant`,
    of one suite and finished; EvalComparisonRefused says why not."""
    before = _get(tenant, before_id, "before")
    after = _get(tenant, after_id, "after")
    if before.suite_id != after.suite_id:
        raise EvalComparisonRefused(
            "invalid",
            f"eval run {str(before.id)[:8]} is of suite {before.suite.slug!r} and "
            f"eval run {str(after.id)[:8]} of suite {after.suite.slug!r}: only "
            "eval runs of one suite can be compared",
            "after",
        )
    sides: tuple[tuple[Side, EvalRun], ...] = (("before", before), ("after", after))
    for side, eval_run in sides:
        if eval_run.status != EvalRun.Status.FINISHED:
            done, total, _ = eval_run_progress(eval_run)
            raise EvalComparisonRefused(
                "not_finished",
                f"The {side} eval run ({str(eval_run.id)[:8]}) is "
                f"{eval_run.status}, {done} of {total} trials done: compare it "
                "once it has finished.",
                side,
                eval_run.status,
            )
    before_summary = eval_run_suite_summary(before)
    after_summary = eval_run_suite_summary(after)
    if before_summary is None or after_summary is None:
        raise EvalComparisonRefused(
            "invalid", "one of the eval runs has no graded trial to compare"
        )
    try:
        comparison = compare_suites(before_summary, after_summary)
    except ValueError as exc:  # no case in common; k above a case's trials
        raise EvalComparisonRefused("invalid", str(exc), "after") from None
    return _document(before, after, comparison)
