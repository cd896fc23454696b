"""Every built-in tool by name, and an agent's tools from its refs: a built-in
tool's name, or `mcp:<server_slug>/<tool_name>` for a tenant's MCP tool
(docs/agents.md, Tool refs)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from runs.engine.contracts import ApprovalNeed, Effect, Idempotency, ToolContract
from runs.engine.disclosure import (
    DISCLOSURE_TOOLS,
    Skill,
    is_deferred,
    load_skill_tool,
    tool_search_tool,
)
from runs.engine.tools import Tool, ToolRegistry
from runs.tools.ask_human import ASK_HUMAN_TOOL
from runs.tools.echo import ECHO_TOOL
from runs.tools.mcp import (
    MCP_REF_PREFIX,
    mcp_contracts_of,
    mcp_tools_for,
    unknown_mcp_refs,
)
from runs.tools.memory import MEMORY_TOOL
from runs.tools.run_code import RUN_CODE_TOOL, run_code_tool
from runs.tools.shop import SHOP_TOOLS, create_replacement
from runs.tools.subagents import subagent_contracts_of

BUILTIN_TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in [*SHOP_TOOLS, RUN_CODE_TOOL, ECHO_TOOL, MEMORY_TOOL, ASK_HUMAN_TOOL]
}


def _configured(name: str, settings: Mapping[str, Any] | None) -> Tool:
    """A built-in tool as the agent's `tool_settings[name]` configures it: its
    egress (run_code) and the agent's approval override, which the tenant's
    policy reads from the contract (runs.services.policy)."""
    tool = BUILTIN_TOOLS[name]
    if name == RUN_CODE_TOOL.name:
        tool = run_code_tool(settings)  # its egress allowlist and credentials
    approval = (settings or {}).get("approval")
    if approval in (ApprovalNeed.ALWAYS, ApprovalNeed.NEVER):
        contract = dataclasses.replace(tool.contract, approval=ApprovalNeed(approval))
        tool = dataclasses.replace(tool, contract=contract)
    if is_deferred(settings):
        tool = dataclasses.replace(tool, deferred=True)
    if name == "create_replacement":
        tool = _replacement_demo_switches(tool, settings or {})
    return tool


def _replacement_demo_switches(tool: Tool, settings: Mapping[str, Any]) -> Tool:
    """The crash demo's switches (docs/demo.md): `idempotency_keys` False is the
    shop without key support, so the contract says so (a plain write, no key)
    and a call cut short by a crash is never re-run: its status is unknown.
    `crash_after_effect` is the kill switch (runs.tools.shop)."""
    honour_keys = settings.get("idempotency_keys", True) is not False
    crash = settings.get("crash_after_effect") is True
    if honour_keys and not crash:
        return tool
    contract = tool.contract
    if not honour_keys:
        contract = dataclasses.replace(
            contract, effect=Effect.WRITE, idempotency=Idempotency.NONE
        )
    handler = functools.partial(
        create_replacement, honour_keys=honour_keys, crash_after_effect=crash
    )
    return dataclasses.replace(tool, contract=contract, handler=handler)


def tool_registry_for(
    refs: Iterable[str],
    *,
    tenant_id: Any = "",
    tool_settings: Mapping[str, Any] | None = None,
    skills: Sequence[Skill] = (),
) -> ToolRegistry:
    """The agent's tools; a ref that names nothing usable is simply absent
    (ENOTOOL), as is an MCP tool that is disabled. With `skills`, `load_skill`
    joins them; with a deferred tool, `tool_search` (runs/engine/disclosure.py)."""
    refs = list(refs)
    settings = tool_settings or {}
    tools = [
        _configured(ref, settings.get(ref)) for ref in refs if ref in BUILTIN_TOOLS
    ]
    if tenant_id and any(ref.startswith(MCP_REF_PREFIX) for ref in refs):
        taken = {tool.name for tool in tools}
        for tool in mcp_tools_for(refs, tenant_id=tenant_id, tool_settings=settings):
            # A model-visible name is the agent's once: a built-in tool keeps its.
            if tool.name not in taken:
                taken.add(tool.name)
                tools.append(tool)
    # The disclosure tools' names are the host's: an MCP tool that would take
    # one (server "tool", tool "search") is not offered.
    tools = [tool for tool in tools if tool.name not in DISCLOSURE_TOOLS]
    deferred = [tool.contract for tool in tools if tool.deferred]
    if skills:
        tools.append(load_skill_tool(skills))
    if deferred:
        tools.append(tool_search_tool(deferred))
    return ToolRegistry(tools)


def unknown_tool_refs(refs: Iterable[str], *, tenant_id: Any) -> list[str]:
    """The refs that name no built-in tool and no MCP tool of the tenant."""
    refs = list(refs)
    unknown_mcp = set(unknown_mcp_refs(refs, tenant_id=tenant_id))
    return [
        ref
        for ref in refs
        if ref in unknown_mcp
        or (not ref.startswith(MCP_REF_PREFIX) and ref not in BUILTIN_TOOLS)
    ]


def tool_contracts_for(*, tenant_id: Any) -> dict[str, ToolContract]:
    """Every contract a tenant's tool calls may have, by model-visible name: the
    built-in tools', the tenant's usable MCP tools' (a built-in name wins) and
    its agents' as sub-agents (`agent__<slug>`)."""
    return {
        **subagent_contracts_of(tenant_id=tenant_id),
        **mcp_contracts_of(tenant_id=tenant_id),
        **{name: tool.contract for name, tool in BUILTIN_TOOLS.items()},
    }
