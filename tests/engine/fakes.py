"""Fakes for engine tests: a tiny shop whose tools record every call."""

from __future__ import annotations

from typing import Any

from runs.engine.contracts import Effect, Idempotency, ToolContract, ToolSource
from runs.engine.tools import ToolContext

ORDER_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string", "pattern": "^[0-9]{4}$"}},
    "required": ["order_id"],
}


class Shop:
    """A fake order service; records every handler invocation."""

    def __init__(self) -> None:
        self.invocations: list[tuple[str, dict[str, Any], ToolContext]] = []
        self.replacements: dict[str, str] = {}

    def lookup_order(self, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.invocations.append(("lookup_order", args, ctx))
        return {"order_id": args["order_id"], "status": "delivered", "damaged": True}

    def create_replacement(
        self, args: dict[str, Any], ctx: ToolContext
    ) -> dict[str, Any]:
        self.invocations.append(("create_replacement", args, ctx))
        key = ctx.idempotency_key
        self.replacements.setdefault(key, f"R-{len(self.replacements) + 1}")
        return {"replacement_id": self.replacements[key]}

    def names(self) -> list[str]:
        return [name for name, _, _ in self.invocations]


def read_only_contract(name: str = "lookup_order") -> ToolContract:
    return ToolContract(
        name=name,
        description="Look up an order by its four-digit id.",
        input_schema=ORDER_SCHEMA,
        effect=Effect.READ_ONLY,
        idempotency=Idempotency.NATURAL,
        source=ToolSource.BUILTIN,
    )


def write_contract(name: str = "create_replacement") -> ToolContract:
    return ToolContract(
        name=name,
        description="Ship a replacement for a damaged order.",
        input_schema=ORDER_SCHEMA,
        effect=Effect.WRITE,
        idempotency=Idempotency.REQUIRED_KEY,
        source=ToolSource.BUILTIN,
    )


def call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    """A scripted tool call entry."""
    entry: dict[str, Any] = {"name": name, "arguments": arguments}
    if call_id is not None:
        entry["id"] = call_id
    return entry
