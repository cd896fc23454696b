"""Every built-in tool by name; an agent's registry holds the ones it names."""

from __future__ import annotations

from collections.abc import Iterable

from runs.engine.tools import Tool, ToolRegistry
from runs.tools.echo import ECHO_TOOL
from runs.tools.run_code import RUN_CODE_TOOL
from runs.tools.shop import SHOP_TOOLS

BUILTIN_TOOLS: dict[str, Tool] = {
    tool.name: tool for tool in [*SHOP_TOOLS, RUN_CODE_TOOL, ECHO_TOOL]
}


def tool_registry_for(names: Iterable[str]) -> ToolRegistry:
    """The agent's tools; a name that is not registered is simply absent (ENOTOOL)."""
    return ToolRegistry(
        [BUILTIN_TOOLS[name] for name in names if name in BUILTIN_TOOLS]
    )
