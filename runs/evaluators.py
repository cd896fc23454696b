"""Evaluators decide whether a finished run succeeded; the model's word is not."""

from __future__ import annotations

from dataclasses import dataclass

from runs.engine.evaluator import Evaluation, EvaluationSubject, Evaluator, Verdict
from runs.models import Run
from runs.tools.shop_models import Replacement

DEMO_ORDER_ID = "4821"


@dataclass(frozen=True)
class ReplacementShippedEvaluator:
    """Kettlecraft: exactly one replacement for the order, and the answer gives its
    delivery date (checked against the shop's state, not the transcript)."""

    tenant_id: str
    order_id: str = DEMO_ORDER_ID

    def evaluate(self, subject: EvaluationSubject) -> Evaluation:
        replacements = list(
            Replacement.objects.filter(
                order__tenant_id=self.tenant_id, order__order_id=self.order_id
            )
        )
        if len(replacements) != 1:
            return Evaluation(
                Verdict.FAILED,
                f"expected exactly one replacement for order {self.order_id}, "
                f"found {len(replacements)}",
            )
        date = replacements[0].delivery_date.isoformat()
        if date not in subject.final_text:
            return Evaluation(
                Verdict.FAILED, f"the answer does not give the delivery date {date}"
            )
        return Evaluation(Verdict.PASSED, f"one replacement, delivery {date} stated")


EVALUATORS = {"kettlecraft_replacement": ReplacementShippedEvaluator}


def evaluator_for(name: str, *, run: Run) -> Evaluator | None:
    """The agent's evaluator, or None (the run then ends `unverified`)."""
    if not name:
        return None
    return EVALUATORS[name](tenant_id=str(run.tenant_id))
