"""The agent-aware diff of two runs of a tenant: each run read as a sequence of
steps (runs/engine/run_align.py), aligned by meaning, with the totals' deltas.

A native run's steps are its Step rows and their ToolCall rows; a run sent over
OTLP has no Step rows, so its steps are read from its spans: each model-call
span (`gen_ai.operation.name` chat, OpenInference LLM, ...) is a step and the
tool spans that start after it, before the next model call, are its calls.
What a reader sees is redacted before it is compared, so a diff never shows a
secret (and a changed secret shows as no change).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db.models import Prefetch

from controlplane.models import Tenant
from controlplane.redaction import redact, redact_text
from runs.engine.envelope import ErrorCode, ToolResult
from runs.engine.loop import LoopResult
from runs.engine.run_align import (
    Alignment,
    ArgumentChange,
    RunStep,
    StepAction,
    StepKind,
    StepPair,
    align_runs,
)
from runs.models import Run, Step, ToolCall
from runs.replay import run_replay
from runs.services.external import EXTERNAL_STOP_REASON
from tracing.models import Span
from tracing.selectors import run_spans_with_payloads

__all__ = ["RunDiff", "run_diff", "run_replay_diff", "run_steps"]

# What a step summary keeps of free text (observations, messages, answers).
SHORT_CHARS = 240
ANSWER_CHARS = 2000
MODEL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "LLM"})
TOOL_OPERATIONS = frozenset({"execute_tool", "TOOL"})


def _short(text: str, limit: int = SHORT_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _said(content: str) -> str:
    """What a tool message said, its JSON keys in one order: a result read back
    from PostgreSQL's jsonb (a replay's) has its keys in another order than the
    text the model read."""
    try:
        value = json.loads(content)
    except ValueError:
        return _short(redact_text(content))
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return _short(redact_text(text))


def _observation_text(row: ToolCall) -> str:
    observation = row.observation or {}
    content = observation.get("content")
    if isinstance(content, str):
        return _said(content)
    error = (row.result or {}).get("error") or {}
    if isinstance(error, dict) and error.get("message"):
        return _short(redact_text(f"{error.get('code', '')}: {error['message']}"))
    return ""


def _native_kind(action: dict[str, Any]) -> StepKind:
    kind = action.get("type")
    if kind == "final_answer":
        return "final_answer"
    if kind == "invalid":
        return "invalid"
    return "tool_calls" if action.get("calls") else "model_only"


def _native_steps(run: Run) -> list[RunStep]:
    rows = (
        Step.objects.filter(run=run)
        .order_by("index")
        .prefetch_related(
            Prefetch("tool_calls", queryset=ToolCall.objects.order_by("position"))
        )
    )
    steps: list[RunStep] = []
    delta: tuple[str, ...] = (_short("user: " + redact_text(run.input)),)
    for row in rows:
        action = row.action or {}
        calls = tuple(
            StepAction(
                tool=call.tool_name,
                arguments=redact(call.args),
                status=call.status,
                observation=_observation_text(call),
            )
            for call in row.tool_calls.all()
        )
        kind = _native_kind(action)
        text = str(action.get("text") or action.get("reason") or "")
        latency = (
            (row.finished_at - row.started_at).total_seconds() * 1000
            if row.finished_at
            else None
        )
        steps.append(
            RunStep(
                index=row.index,
                kind=kind,
                calls=calls,
                text=redact_text(text)[:ANSWER_CHARS],
                model=row.model,
                input_tokens=row.input_tokens,
                output_tokens=row.output_tokens,
                cost=row.cost,
                latency_ms=latency,
                input_delta=delta,
            )
        )
        # What the model reads next: each call's result as a tool message.
        delta = tuple(
            _short(f"tool {call.tool}: {call.observation or call.status}")
            for call in calls
        )
    return steps


def _decoded(text: str | None) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    # A sender may put JSON text inside the attribute (OpenInference input.value).
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


def _message_text(message: Any) -> str:
    """The words of one GenAI message, whichever convention shaped it."""
    if isinstance(message, str):
        return message
    if not isinstance(message, dict):
        return json.dumps(message, ensure_ascii=False, default=str)
    for key in ("content", "message.content", "text"):
        if isinstance(message.get(key), str):
            return str(message[key])
    parts = message.get("parts") or message.get("content")
    if isinstance(parts, list):
        return " ".join(
            str(part.get("content") or part.get("text") or part.get("name") or "")
            if isinstance(part, dict)
            else str(part)
            for part in parts
        )
    return json.dumps(message, ensure_ascii=False, default=str)


def _messages(value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    if value is None:
        return []
    return [value]


def _role(message: Any) -> str:
    if isinstance(message, dict):
        return str(message.get("role") or message.get("message.role") or "message")
    return "message"


def _number(value: Any) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return 0


def _cost(value: Any) -> Decimal:
    try:
        return Decimal(str(value)) if value is not None else Decimal(0)
    except ArithmeticError:
        return Decimal(0)


def _span_ms(span: Span) -> float | None:
    if span.ended_at is None:
        return None
    return (span.ended_at - span.started_at).total_seconds() * 1000


def _span_call_status(span: Span) -> str:
    """A tool span's status in the tool call's words, so an ingested call and a
    native one that both worked compare equal."""
    if span.status in (Span.Status.ERROR, Span.Status.ABANDONED):
        return "failed"
    if span.ended_at is None or span.status == Span.Status.RUNNING:
        return "executing"
    return "succeeded"


def _operation(span: Span) -> str:
    a = span.attributes
    return str(a.get("gen_ai.operation.name") or a.get("openinference.span.kind") or "")


@dataclass
class _SpanStep:
    span: Span | None
    payloads: dict[str, str]
    tools: list[tuple[Span, dict[str, str]]]


def _external_steps(run: Run) -> list[RunStep]:
    spans = run_spans_with_payloads(tenant=run.tenant, run_id=run.id)
    grouped: list[_SpanStep] = []
    for span, payloads in spans:
        operation = _operation(span)
        if operation in MODEL_OPERATIONS:
            grouped.append(_SpanStep(span, payloads, []))
        elif operation in TOOL_OPERATIONS or span.name.startswith("execute_tool"):
            if not grouped:  # a tool called before any model call
                grouped.append(_SpanStep(None, {}, []))
            grouped[-1].tools.append((span, payloads))
    steps: list[RunStep] = []
    seen_messages = 0
    for position, group in enumerate(grouped):
        calls = tuple(
            StepAction(
                tool=str(
                    tool.attributes.get("gen_ai.tool.name")
                    or tool.name.removeprefix("execute_tool ")
                ),
                arguments=redact(
                    _decoded(data.get("gen_ai.tool.call.arguments")) or {}
                ),
                status=_span_call_status(tool),
                observation=_short(
                    redact_text(
                        _message_text(_decoded(data.get("gen_ai.tool.call.result")))
                        if "gen_ai.tool.call.result" in data
                        else tool.status_message
                    )
                ),
            )
            for tool, data in group.tools
        )
        chat = group.span
        attrs = chat.attributes if chat else {}
        inputs = _messages(_decoded(group.payloads.get("gen_ai.input.messages")))
        outputs = _messages(_decoded(group.payloads.get("gen_ai.output.messages")))
        # The conversation grows: what is new is what the previous call lacked.
        fresh = inputs[seen_messages:] if len(inputs) >= seen_messages else inputs
        seen_messages = len(inputs)
        text = " ".join(_message_text(m) for m in outputs)
        last = position == len(grouped) - 1
        kind: StepKind = (
            "tool_calls" if calls else ("final_answer" if last else "model_only")
        )
        if kind == "final_answer" and run.final_answer:
            text = run.final_answer
        steps.append(
            RunStep(
                index=position,
                kind=kind,
                calls=calls,
                text=redact_text(text)[:ANSWER_CHARS],
                model=str(
                    attrs.get("gen_ai.response.model")
                    or attrs.get("gen_ai.request.model")
                    or ""
                ),
                input_tokens=_number(attrs.get("gen_ai.usage.input_tokens")),
                output_tokens=_number(attrs.get("gen_ai.usage.output_tokens")),
                cost=_cost(attrs.get("cp.usage.cost")),
                latency_ms=_span_ms(chat) if chat else None,
                input_delta=tuple(
                    _short(f"{_role(m)}: {redact_text(_message_text(m))}")
                    for m in fresh[-5:]
                ),
            )
        )
    return steps


def run_steps(run: Run) -> list[RunStep]:
    """The run as steps: its Step rows, or its spans for a run sent over OTLP."""
    if run.stop_reason == EXTERNAL_STOP_REASON:
        return _external_steps(run)
    return _native_steps(run)


def _change(change: ArgumentChange) -> dict[str, Any]:
    return {
        "path": change.path,
        "op": change.op,
        "left": change.left,
        "right": change.right,
    }


def _step(step: RunStep | None) -> dict[str, Any] | None:
    if step is None:
        return None
    return {
        "index": step.index,
        "action": step.kind,
        "text": step.text,
        "model": step.model,
        "input_tokens": step.input_tokens,
        "output_tokens": step.output_tokens,
        "cost": str(step.cost),
        "latency_ms": None if step.latency_ms is None else round(step.latency_ms, 1),
        "input_delta": list(step.input_delta),
        "calls": [
            {
                "tool": call.tool,
                "arguments": call.arguments,
                "status": call.status,
                "observation": call.observation,
            }
            for call in step.calls
        ],
    }


def _pair(pair: StepPair) -> dict[str, Any]:
    left, right = pair.left, pair.right
    # The model input delta: what this step's model read that the other side's
    # did not (empty when both read the same new messages).
    same_input = left and right and left.input_delta == right.input_delta
    return {
        "kind": pair.kind,
        "reasons": list(pair.reasons),
        "left": _step(left),
        "right": _step(right),
        "input_differs": not same_input,
        "argument_changes": [
            [_change(change) for change in changes] for changes in pair.argument_changes
        ],
    }


def _seconds(run: Run) -> float | None:
    if run.started_at is None or run.finished_at is None:
        return None
    return (run.finished_at - run.started_at).total_seconds()


def _totals(run: Run, steps: list[RunStep]) -> dict[str, Any]:
    return {
        "steps": len(steps),
        "tool_calls": sum(len(step.calls) for step in steps),
        "input_tokens": run.input_tokens,
        "output_tokens": run.output_tokens,
        "cost": str(run.cost),
        "duration_s": _seconds(run),
    }


def _delta(left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    for key, a in left.items():
        b = right[key]
        if key == "cost":
            delta[key] = str(Decimal(b) - Decimal(a))
        elif a is None or b is None:
            delta[key] = None
        else:
            delta[key] = round(b - a, 3) if isinstance(a, float) else b - a
    return delta


@dataclass
class Side:
    """One side of a diff: what the reader sees of the run, and its totals."""

    summary: dict[str, Any]
    totals: dict[str, Any]
    steps: list[RunStep]


@dataclass
class RunDiff:
    left: Side
    right: Side
    alignment: Alignment

    def as_dict(self) -> dict[str, Any]:
        first = self.alignment.first_divergence
        return {
            "left": {**self.left.summary, "totals": self.left.totals},
            "right": {**self.right.summary, "totals": self.right.totals},
            "totals_delta": _delta(self.left.totals, self.right.totals),
            "counts": {
                kind: self.alignment.count(kind)
                for kind in ("same", "changed", "inserted", "skipped")
            },
            "first_divergence": None
            if first is None
            else {
                "pair": first.pair,
                "left_index": first.left_index,
                "right_index": first.right_index,
                "reason": first.reason,
            },
            "pairs": [_pair(pair) for pair in self.alignment.pairs],
        }


def _summary(run: Run) -> dict[str, Any]:
    return {
        "id": str(run.id),
        "agent": run.agent.slug,
        "agent_version": run.agent_version.number if run.agent_version else None,
        "status": run.status,
        "external": run.stop_reason == EXTERNAL_STOP_REASON,
        "replay": False,
        "input": _short(redact_text(run.input)),
        "final_answer": redact_text(run.final_answer)[:ANSWER_CHARS],
        "created_at": run.created_at.isoformat(),
    }


def _run_side(run: Run) -> Side:
    steps = run_steps(run)
    return Side(summary=_summary(run), totals=_totals(run, steps), steps=steps)


def _diff(left: Side, right: Side) -> RunDiff:
    return RunDiff(
        left=left, right=right, alignment=align_runs(left.steps, right.steps)
    )


def run_diff(*, tenant: Tenant, left: Run, right: Run) -> RunDiff:
    """Align two runs of `tenant` (the caller has read both as the tenant's)."""
    assert left.tenant_id == tenant.id and right.tenant_id == tenant.id
    return _diff(_run_side(left), _run_side(right))


def _replayed_status(call_id: str, result: ToolResult, executed: list[str]) -> str:
    """A replayed call's status in a ToolCall's words: the recorded tool answers
    every call it is asked, so a call that was not asked was refused or denied."""
    if call_id in executed:
        return ToolCall.Status.SUCCEEDED if result.ok else ToolCall.Status.FAILED
    if result.error is not None and result.error.code == ErrorCode.EPERM:
        return ToolCall.Status.DENIED
    return ToolCall.Status.REFUSED


def _replayed_steps(run: Run, result: LoopResult) -> list[RunStep]:
    said = {
        message.get("tool_call_id"): str(message.get("content") or "")
        for message in result.messages
        if message.get("role") == "tool"
    }
    steps: list[RunStep] = []
    delta: tuple[str, ...] = (_short("user: " + redact_text(run.input)),)
    for record in result.steps:
        reply = record.reply
        calls = tuple(
            StepAction(
                tool=call.name,
                arguments=redact(dict(call.arguments)),
                status=_replayed_status(call.call_id, outcome, record.executed),
                observation=_said(said.get(call.call_id, "")),
            )
            for call, outcome in zip(record.calls, record.results, strict=False)
        )
        kind: StepKind = (
            "tool_calls"
            if reply.tool_calls
            else "final_answer"
            if reply.text
            else "model_only"
        )
        steps.append(
            RunStep(
                index=record.index,
                kind=kind,
                calls=calls,
                text=redact_text(reply.text or "")[:ANSWER_CHARS],
                model=reply.model,
                input_tokens=reply.usage.input_tokens,
                output_tokens=reply.usage.output_tokens,
                input_delta=delta,
            )
        )
        delta = tuple(
            _short(f"tool {call.tool}: {call.observation or call.status}")
            for call in calls
        )
    return steps


def run_replay_diff(*, tenant: Tenant, run: Run) -> RunDiff:
    """The run (left) beside its replay from the record under today's policy
    and evaluator (right; runs/replay.py): where a replay differs, this shows
    where and how."""
    assert run.tenant_id == tenant.id
    report = run_replay(run=run)
    assert report.result is not None
    result = report.result
    steps = _replayed_steps(run, result)
    usage = result.state.usage
    replay = Side(
        summary={
            **_summary(run),
            "status": str(result.status),
            "replay": True,
            "final_answer": redact_text(result.final_text or "")[:ANSWER_CHARS],
        },
        totals={
            "steps": len(steps),
            "tool_calls": sum(len(step.calls) for step in steps),
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cost": str(usage.cost),
            "duration_s": None,
        },
        steps=steps,
    )
    return _diff(_run_side(run), replay)
