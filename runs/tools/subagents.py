"""Sub-agents as tools: each agent a version lists in `subagents` is offered to
the model as `agent__<slug>`, with one argument, the task brief. The host never
runs its handler: a call starts a child run (runs.services.subagents)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from runs.engine.contracts import Effect, Idempotency, ToolContract, ToolSource
from runs.engine.envelope import ErrorCode, ToolResult
from runs.engine.tools import Tool, ToolContext
from runs.models import Agent

SUBAGENT_TOOL_PREFIX = "agent__"
# The longest brief a parent may hand a child (its input).
MAX_TASK_CHARS = 20_000
MAX_DESCRIPTION_CHARS = 1_000
MAX_TOOL_NAME_CHARS = 64  # runs.engine.contracts.TOOL_NAME_PATTERN


def subagent_tool_name(slug: str) -> str:
    return f"{SUBAGENT_TOOL_PREFIX}{slug}"


def subagent_slug_of(tool_name: str) -> str | None:
    """The agent a tool name delegates to, or None for any other tool."""
    if tool_name.startswith(SUBAGENT_TOOL_PREFIX):
        return tool_name[len(SUBAGENT_TOOL_PREFIX) :] or None
    return None


def subagent_entries(value: Iterable[Any]) -> list[dict[str, str]]:
    """A version's `subagents` as objects ({"agent", "description"}): a bare
    slug is accepted on input and stored as one."""
    entries = []
    for item in value:
        if isinstance(item, str):
            entries.append({"agent": item, "description": ""})
        elif isinstance(item, Mapping):
            entries.append(
                {
                    "agent": str(item.get("agent", "")),
                    "description": str(item.get("description") or ""),
                }
            )
    return entries


def _never_called(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    # The step starts a child run instead (runs.services.subagents); a handler
    # reached anyway says so rather than pretend the child answered.
    return ToolResult.failure(
        ErrorCode.EINTERNAL, "a sub-agent call is started by the host, not executed"
    )


def subagent_tool(slug: str, name: str, description: str) -> Tool:
    text = description.strip() or f"The agent {name!r} ({slug})."
    return Tool(
        ToolContract(
            name=subagent_tool_name(slug),
            description=(
                f"Delegate a task to the sub-agent {slug!r}: {text} It works on "
                "its own with its own tools and returns its final answer (or why "
                "it stopped). Give it a complete, self-contained brief."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "task": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_TASK_CHARS,
                        "description": "the task brief: everything it needs to know",
                    }
                },
                "required": ["task"],
            },
            # What the child does is gated inside the child, call by call.
            effect=Effect.READ_ONLY,
            idempotency=Idempotency.NATURAL,
            source=ToolSource.BUILTIN,
        ),
        _never_called,
        timeout_seconds=None,
    )


def subagent_tools_for(value: Iterable[Any], *, tenant_id: Any) -> list[Tool]:
    """The tools of a version's sub-agents that still exist in the tenant (one
    read); a deleted or disabled agent's call is refused when made."""
    entries = subagent_entries(value)
    if not entries:
        return []
    names = dict(
        Agent.objects.filter(
            tenant_id=tenant_id,
            slug__in=[entry["agent"] for entry in entries],
            deleted_at__isnull=True,
        ).values_list("slug", "name")
    )
    return [
        subagent_tool(entry["agent"], names[entry["agent"]], entry["description"])
        for entry in entries
        if entry["agent"] in names
    ]


def subagent_contracts_of(*, tenant_id: Any) -> dict[str, ToolContract]:
    """The contract of every live agent of the tenant as a sub-agent tool: what
    an approval rule naming `agent__<slug>` is checked against."""
    if not tenant_id:
        return {}
    rows = Agent.objects.filter(
        tenant_id=tenant_id, deleted_at__isnull=True, current_version__isnull=False
    ).values_list("slug", "name")
    tools = [
        subagent_tool(slug, name, "")
        for slug, name in rows
        if len(subagent_tool_name(slug)) <= MAX_TOOL_NAME_CHARS
    ]
    return {tool.name: tool.contract for tool in tools}
