"""The CI verdict of a finished eval run, as the server computes it for a client
(docs/evals.md, "Agents that run outside"): the case lines and the suite's
figures, each gate clause with its actual value, the regression check against a
baseline, and the JUnit XML, so a client prints and writes what it is given
instead of re-implementing the statistics."""

from __future__ import annotations

import uuid
from typing import Any

from controlplane.models import Tenant
from runs.engine.eval_gate import Gate, evaluate_gate, parse_gate, regression_check
from runs.engine.eval_report import suite_report_lines
from runs.engine.junit import JUnitRun, junit_xml
from runs.evals.results import eval_run_suite_summary
from runs.models import EvalRun, EvalSuite

__all__ = [
    "VerdictRefused",
    "eval_baseline_of",
    "eval_gate_parse",
    "eval_run_verdict",
]


class VerdictRefused(ValueError):
    """A gate or baseline that cannot be used; `field` names it (a 400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def eval_gate_parse(expression: str | None) -> Gate | None:
    if not expression:
        return None
    try:
        return parse_gate(expression)
    except ValueError as bad:
        raise VerdictRefused("gate", str(bad)) from None


def _same_agent(runs: Any, eval_run: EvalRun) -> Any:
    if eval_run.agent_version is not None:
        return runs.filter(agent_version__agent_id=eval_run.agent_version.agent_id)
    return runs.filter(
        agent_version__isnull=True, external_agent=eval_run.external_agent
    )


def eval_baseline_of(
    *,
    tenant: Tenant,
    suite: EvalSuite,
    choice: str | None,
    like: EvalRun | None = None,
    external_agent: str = "",
) -> EvalRun | None:
    """`LAST` (the newest finished eval run of the suite for the same agent
    started before `like`) or a finished eval run id of the suite; None for no
    choice or no LAST yet. VerdictRefused naming `baseline` otherwise."""
    if not choice:
        return None
    finished = EvalRun.objects.filter(
        tenant=tenant, suite=suite, status=EvalRun.Status.FINISHED
    ).select_related("agent_version__agent")
    if choice.upper() == "LAST":
        if like is not None:
            # Started before this one: a verdict asked again later keeps its
            # baseline.
            candidates = _same_agent(finished, like).filter(
                created_at__lt=like.created_at
            )
        else:
            candidates = finished.filter(
                agent_version__isnull=True, external_agent=external_agent
            )
        found: EvalRun | None = candidates.order_by(
            "-finished_at", "-created_at"
        ).first()
        return found
    try:
        wanted = uuid.UUID(choice)
    except ValueError:
        raise VerdictRefused(
            "baseline", f"{choice!r} is neither LAST nor an eval run id"
        ) from None
    found = finished.filter(id=wanted).first()
    if found is None:
        raise VerdictRefused(
            "baseline", f"no finished eval run {choice} of suite {suite.slug}"
        )
    return found


def eval_run_verdict(
    *, eval_run: EvalRun, gate: str | None, baseline: str | None
) -> dict[str, Any]:
    """The verdict document of a finished eval run (the caller checks that)."""
    parsed = eval_gate_parse(gate)
    base = eval_baseline_of(
        tenant=eval_run.tenant, suite=eval_run.suite, choice=baseline, like=eval_run
    )
    summary = eval_run_suite_summary(eval_run)
    assert summary is not None  # a finished eval run has graded trials
    failed = False
    document: dict[str, Any] = {
        "eval_run": str(eval_run.id),
        "lines": suite_report_lines(summary),
        "notes": list(eval_run.summary.get("notes", [])),
        "gate": None,
        "regression": None,
        "junit": junit_xml(
            [
                JUnitRun(
                    name=eval_run.suite.slug,
                    summary=summary,
                    run_id=str(eval_run.id),
                    timestamp=eval_run.started_at,
                )
            ]
        ),
    }
    if parsed is not None:
        result = evaluate_gate(parsed, summary)
        document["gate"] = {
            "expression": parsed.source,
            "passed": result.passed,
            "clauses": [clause.describe() for clause in result.clauses],
        }
        failed |= not result.passed
    if baseline:
        document["regression"] = _regression(base, summary, eval_run, baseline)
        failed |= not document["regression"]["passed"]
    document["passed"] = not failed
    return document


def _regression(
    base: EvalRun | None, summary: Any, eval_run: EvalRun, choice: str
) -> dict[str, Any]:
    if base is None:
        return {
            "baseline": None,
            "passed": True,
            "reasons": [],
            "message": f"no baseline: no finished eval run of {eval_run.suite.slug} "
            f"for {eval_run.agent_name} before this one ({choice})",
        }
    before = eval_run_suite_summary(base)
    assert before is not None
    try:
        result = regression_check(baseline=before, current=summary)
    except ValueError as unusable:
        return {
            "baseline": str(base.id),
            "passed": False,
            "reasons": [str(unusable)],
            "message": f"regression check against {base.id}: {unusable}",
        }
    verdict = "ok" if result.passed else "FAILED"
    return {
        "baseline": str(base.id),
        "passed": result.passed,
        "reasons": list(result.reasons),
        "message": f"regression check against {base.id}: {verdict}",
    }
