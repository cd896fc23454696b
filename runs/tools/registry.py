"""Every built-in tool by name, and an agent's tools from its refs: a built-in
tool's name, or `mcp:<server_slug>/<tool_name>` for a tenant's MCP tool
(docs/agents.md, Tool refs)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from runs.engine.contracts import ApprovalNeed, ToolContract
from runs.engine.tools import Tool, ToolRegistry
from runs.tools.echo import ECHO_TOOL
from runs.tools.mcp import (
    MCP_REF_PREFIX,
    mcp_contracts_of,
    mcp_tools_for,
    unknown_mcp_refs,
)
from runs.tools.run_code import RUN_CODE_TOOL, run_code_tool
from runs.tools.shop import SHOP_TOOLS

BUILTIN_TOOLS: dict[str, Tool] = {
    tool.name: tool for tool in [*SHOP_TOOLS, RUN_CODE_TOOL, ECHO_TOOL]
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
    return tool


def tool_registry_for(
    refs: Iterable[str],
    *,
    tenant_id: Any = "",
    tool_settings: Mapping[str, Any] | None = None,
) -> ToolRegistry:
    """The agent's tools; a ref that names nothing usable is simply absent
    (ENOTOOL), as is an MCP tool that is disabled."""
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
    built-in tools' and the tenant's usable MCP tools' (a built-in name wins)."""
    return {
        **mcp_contracts_of(tenant_id=tenant_id),
        **{name: tool.contract for name, tool in BUILTIN_TOOLS.items()},
    }
