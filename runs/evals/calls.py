"""The tool calls graders read, from either kind of run: a hosted run's
`ToolCall` rows, or an external run's tool spans (OTLP-ingested; the same
spans the run diff reads as steps, runs.run_diff)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runs.models import Run, ToolCall
from runs.run_diff import TOOL_OPERATIONS
from runs.services.external import EXTERNAL_STOP_REASON
from tracing.models import Span
from tracing.selectors import run_spans_with_payloads

__all__ = ["GradedCall", "run_graded_calls"]


@dataclass(frozen=True)
class GradedCall:
    """One tool call as graders see it, whichever way it was recorded."""

    tool_name: str
    args: Any  # the arguments, decoded JSON ({} when the span carried none)
    status: str  # succeeded | failed | executing | ... (ToolCall's words)
    step_index: int


def run_graded_calls(run: Run) -> list[GradedCall]:
    """The run's tool calls in the order they were made."""
    if run.stop_reason == EXTERNAL_STOP_REASON:
        return _span_calls(run)
    rows = (
        ToolCall.objects.filter(run=run)
        .select_related("step")
        .order_by("step__index", "position")
    )
    return [
        GradedCall(row.tool_name, row.args, row.status, row.step.index) for row in rows
    ]


def _span_calls(run: Run) -> list[GradedCall]:
    """Each `execute_tool` span (by `gen_ai.operation.name`, the OpenInference
    kind, or its name), its tool from `gen_ai.tool.name`, its arguments from
    `gen_ai.tool.call.arguments`; the span's status says whether it worked."""
    calls: list[GradedCall] = []
    for span, payloads in run_spans_with_payloads(tenant=run.tenant, run_id=run.id):
        attributes = span.attributes
        operation = str(
            attributes.get("gen_ai.operation.name")
            or attributes.get("openinference.span.kind")
            or ""
        )
        if operation not in TOOL_OPERATIONS and not span.name.startswith(
            "execute_tool"
        ):
            continue
        tool = str(
            attributes.get("gen_ai.tool.name")
            or span.name.removeprefix("execute_tool ")
        )
        raw = payloads.get("gen_ai.tool.call.arguments")
        if raw is None:
            raw = attributes.get("gen_ai.tool.call.arguments")
        calls.append(GradedCall(tool, _arguments(raw), _status(span), len(calls)))
    return calls


def _arguments(raw: Any) -> Any:
    """Decoded arguments; a sender may put JSON text inside the JSON attribute."""
    value = raw
    for _ in range(2):
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            break
    return {} if value is None else value


def _status(span: Span) -> str:
    if span.status in (Span.Status.ERROR, Span.Status.ABANDONED):
        return "failed"
    if span.ended_at is None or span.status == Span.Status.RUNNING:
        return "executing"
    return "succeeded"
