"""Evaluators: host-side checks of the world that decide `succeeded` or `failed`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol


class Verdict(StrEnum):
    PASSED = "passed"
    FAILED = "failed"


@dataclass(frozen=True)
class Evaluation:
    verdict: Verdict
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"verdict": str(self.verdict), "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evaluation:
        return cls(verdict=Verdict(data["verdict"]), reason=str(data["reason"]))


@dataclass(frozen=True)
class EvaluationSubject:
    """What an evaluator sees: the run's input, its final answer and its messages."""

    run_id: str
    input: str
    final_text: str
    messages: Sequence[Mapping[str, Any]] = field(default_factory=tuple)


class Evaluator(Protocol):
    def evaluate(self, subject: EvaluationSubject) -> Evaluation: ...


def run_evaluator(evaluator: Evaluator, subject: EvaluationSubject) -> Evaluation:
    """Evaluate; an evaluator that raises fails the run rather than passing it."""
    try:
        evaluation = evaluator.evaluate(subject)
    except Exception as exc:  # noqa: BLE001 - a broken check must not pass a run
        return Evaluation(Verdict.FAILED, f"evaluator_error: {type(exc).__name__}")
    if not isinstance(evaluation, Evaluation):
        return Evaluation(Verdict.FAILED, "evaluator_error: no Evaluation returned")
    return evaluation


UNVERIFIED_REASON = (
    "the agent has no evaluator: nothing checked the outcome; the run ended "
    "because the model said it was done"
)
NOT_EVALUATED_REASON = "not evaluated: the run stopped before the agent finished"


def verdict_of(status: str, evaluation: Mapping[str, Any] | None) -> tuple[str, str]:
    """What a person is told about a finished run's outcome: the evaluator's
    verdict (`passed`/`failed`) and reason, `unverified` when the agent had no
    evaluator, `none` when the run stopped before there was anything to judge."""
    if evaluation and evaluation.get("verdict"):
        return str(evaluation["verdict"]), str(evaluation.get("reason") or "")
    if status == "unverified":
        return "unverified", UNVERIFIED_REASON
    return "none", NOT_EVALUATED_REASON
