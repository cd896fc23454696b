"""`echo`: returns its input; a no-op tool for smoke tests and step benchmarks."""

from __future__ import annotations

from typing import Any

from runs.engine.contracts import Effect, Idempotency, ToolContract, ToolSource
from runs.engine.tools import Tool, ToolContext


def echo(arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"text": arguments["text"]}


ECHO_TOOL = Tool(
    ToolContract(
        name="echo",
        description="Return the given text unchanged.",
        input_schema={
            "type": "object",
            "properties": {"text": {"type": "string", "maxLength": 10_000}},
            "required": ["text"],
        },
        effect=Effect.READ_ONLY,
        idempotency=Idempotency.NATURAL,
        source=ToolSource.BUILTIN,
    ),
    echo,
    timeout_seconds=None,
)
