"""Evaluators decide whether a finished run succeeded; the model's word is not."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runs.engine.evaluator import Evaluation, EvaluationSubject, Evaluator, Verdict

DEMO_ORDER_ID = "4821"


def _json_object(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def recorded_calls(
    messages: Sequence[Mapping[str, Any]], tool_name: str
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Each call of `tool_name` in the transcript with the host-recorded
    observation that answered it: (arguments, observation body)."""
    observations = {
        str(m.get("tool_call_id")): _json_object(m.get("content"))
        for m in messages
        if m.get("role") == "tool"
    }
    for message in messages:
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            if function.get("name") == tool_name:
                yield (
                    _json_object(function.get("arguments")),
                    observations.get(str(call.get("id")), {}),
                )


@dataclass(frozen=True)
class ReplacementShippedEvaluator:
    """Kettlecraft: this run shipped exactly one replacement for the order, and its
    answer gives that replacement's delivery date.

    It judges from the run's recorded observations (tool results the host
    recorded, never the model's words), so it counts only what this run did (other
    runs of the same order do not), and a replay judges exactly as the run did
    without reading the live shop."""

    order_id: str = DEMO_ORDER_ID

    def evaluate(self, subject: EvaluationSubject) -> Evaluation:
        shipped: dict[str, str] = {}
        refused: list[str] = []
        for arguments, observation in recorded_calls(
            subject.messages, "create_replacement"
        ):
            if str(arguments.get("order_id")) != self.order_id:
                continue
            data = observation.get("data")
            if observation.get("ok") and isinstance(data, dict):
                shipped[str(data.get("replacement_id"))] = str(
                    data.get("delivery_date")
                )
            elif isinstance(observation.get("error"), dict):
                refused.append(str(observation["error"].get("message", "")))
        if not shipped:
            why = f": {refused[-1]}" if refused else ""
            return Evaluation(
                Verdict.FAILED,
                f"no replacement was shipped for order {self.order_id}{why}",
            )
        if len(shipped) > 1:
            return Evaluation(
                Verdict.FAILED,
                f"this run shipped {len(shipped)} replacements for order "
                f"{self.order_id}, expected one",
            )
        (date,) = shipped.values()
        if date not in subject.final_text:
            return Evaluation(
                Verdict.FAILED, f"the answer does not give the delivery date {date}"
            )
        return Evaluation(Verdict.PASSED, f"one replacement, delivery {date} stated")


@dataclass(frozen=True)
class WarrantyAnsweredEvaluator:
    """Kettlecraft's warranty desk (the demo's second agent): this run looked the
    order's warranty up with the MCP tool and its answer gives the months left
    that the tool returned (from the recorded observation, as above)."""

    order_id: str = DEMO_ORDER_ID
    tool_name: str = "warranty_warranty_lookup"  # mcp:warranty/warranty_lookup

    def evaluate(self, subject: EvaluationSubject) -> Evaluation:
        months: list[str] = []
        for arguments, observation in recorded_calls(subject.messages, self.tool_name):
            data = observation.get("data")
            if str(arguments.get("order_id")) != self.order_id or not isinstance(
                data, dict
            ):
                continue
            structured = data.get("structured")
            if observation.get("ok") and isinstance(structured, dict):
                months.append(str(structured.get("months_left")))
        if not months:
            return Evaluation(
                Verdict.FAILED,
                f"the warranty of order {self.order_id} was not looked up",
            )
        stated = f"{months[-1]} more months"
        if stated not in subject.final_text:
            return Evaluation(
                Verdict.FAILED, f"the answer does not say {stated!r} of warranty"
            )
        return Evaluation(Verdict.PASSED, f"warranty looked up, {stated} stated")


EVALUATORS: dict[str, type[Evaluator]] = {
    "kettlecraft_replacement": ReplacementShippedEvaluator,
    "kettlecraft_warranty": WarrantyAnsweredEvaluator,
}


def evaluator_for(name: str) -> Evaluator | None:
    """The agent's evaluator, or None (the run then ends `unverified`)."""
    if not name:
        return None
    return EVALUATORS[name]()
