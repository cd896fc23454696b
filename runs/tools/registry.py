"""Every built-in tool by name; an agent's registry holds the ones it names."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from runs.engine.tools import Tool, ToolRegistry
from runs.tools.echo import ECHO_TOOL
from runs.tools.run_code import RUN_CODE_TOOL, run_code_tool
from runs.tools.shop import SHOP_TOOLS

BUILTIN_TOOLS: dict[str, Tool] = {
    tool.name: tool for tool in [*SHOP_TOOLS, RUN_CODE_TOOL, ECHO_TOOL]
}


def _configured(name: str, settings: Mapping[str, Any] | None) -> Tool:
    """A built-in tool as the agent's `tool_settings[name]` configures it."""
    if name == RUN_CODE_TOOL.name:
        return run_code_tool(settings)  # its egress allowlist and credentials
    return BUILTIN_TOOLS[name]


def tool_registry_for(
    names: Iterable[str],
    *,
    tenant_id: str = "",
    tool_settings: Mapping[str, Any] | None = None,
) -> ToolRegistry:
    """The agent's tools; a name that is not registered is simply absent (ENOTOOL)."""
    settings = tool_settings or {}
    return ToolRegistry(
        [
            _configured(name, settings.get(name))
            for name in names
            if name in BUILTIN_TOOLS
        ]
    )
