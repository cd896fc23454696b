"""The span of a call that started a sub-agent run: `execute_tool agent__<slug>`,
stored when the child starts and ended when the parent records the child's
outcome; the child's root span is its child (runs.spans._root_parent), so the
parent's trace holds the whole tree."""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry.trace import SpanKind

from runs.engine.envelope import ToolResult
from runs.models import Run
from runs.spans import (
    _json,
    _resume_and_end,
    _run_attributes,
    _trace_id,
    _traced,
    subagent_span_id,
)
from tracing.processor import long_lived
from tracing.setup import fixed_ids, tracer

logger = logging.getLogger(__name__)


def subagent_span_open(run: Run, *, tool_call: Any, child: Run) -> None:
    """Start the call's span under the current step; it ends with the child."""
    if not _traced(run):
        return
    try:
        with (
            long_lived(),
            fixed_ids(trace_id=_trace_id(run), span_id=subagent_span_id(tool_call.id)),
        ):
            tracer().start_span(
                f"execute_tool {tool_call.tool_name}",
                kind=SpanKind.INTERNAL,
                attributes={
                    **_run_attributes(run),
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool_call.tool_name,
                    "gen_ai.tool.call.id": tool_call.call_id,
                    "gen_ai.tool.type": "function",
                    "gen_ai.tool.call.arguments": tool_call.raw_args
                    or _json(tool_call.args),
                    "cp.subagent.run_id": str(child.id),
                    "cp.subagent.agent": child.agent.slug,
                    "cp.subagent.limits": _json(child.limits),
                },
            )
    except Exception:  # noqa: BLE001 - tracing never stops a run
        logger.warning("tracing: sub-agent span of %s", tool_call.id, exc_info=True)


def subagent_span_settle(
    run: Run, *, tool_call: Any, child: Run, result: ToolResult
) -> None:
    """End the call's span with the child's outcome (what the parent sees)."""
    if not _traced(run):
        return
    error = ""
    if not result.ok and result.error is not None:
        error = str(result.error.code)
    try:
        _resume_and_end(
            run,
            span_id=f"{subagent_span_id(tool_call.id):016x}",
            attributes={
                "gen_ai.tool.call.result": _json(result.to_dict()),
                "cp.tool.executed": True,
                "cp.subagent.status": child.status,
                "cp.subagent.answer": child.final_answer,
            },
            error=error,
            error_type=error,
        )
    except Exception:  # noqa: BLE001 - tracing never stops a run
        logger.warning("tracing: sub-agent span of %s", tool_call.id, exc_info=True)
