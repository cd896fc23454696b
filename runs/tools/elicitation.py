"""An MCP server's elicitation, between the MCP tools and the step: a call that
needs a person's input returns a result carrying an `input_required` ref (the
step asks the person, runs.services.questions), and a re-run of the call is
given the answers recorded so far, in order (runs/tools/mcp.py)."""

from __future__ import annotations

from typing import Any

from approvals.models import Question
from approvals.questions import elicitation_content
from runs.engine.envelope import ErrorCode, ToolResult

INPUT_REQUIRED = "input_required"


def input_required_result(
    tool_name: str, message: str, schema: dict[str, Any] | None
) -> ToolResult:
    """The result of a call stopped for a person's input (never shown to the
    model: the step turns it into a question and re-runs the call)."""
    return ToolResult.failure(
        ErrorCode.EINTERNAL,
        f"{tool_name} waits for a person's answer: {message}",
        retryable=False,
        refs=({"kind": INPUT_REQUIRED, "message": message, "schema": schema},),
    )


def input_required_of(result: ToolResult) -> dict[str, Any] | None:
    """The server's request (message, schema) if the call stopped for input."""
    for ref in result.refs:
        if ref.get("kind") == INPUT_REQUIRED:
            return dict(ref)
    return None


def elicitation_answers_for(*, run_id: str, call_id: str) -> list[dict[str, Any]]:
    """The form contents a person gave this call's elicitations, in order."""
    answered = Question.objects.filter(
        run_id=run_id,
        tool_call__call_id=call_id,
        kind=Question.Kind.ELICITATION,
        status=Question.Status.ANSWERED,
    ).order_by("asked_at")
    return [elicitation_content(q.schema, q.answer) for q in answered]
