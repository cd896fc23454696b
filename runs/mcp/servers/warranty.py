"""A small MCP server (stdio) for the demo and the tests: Kettlecraft warranties.

Run inside the sandbox by the control plane (`python3 warranty.py`); it needs only
the `mcp` package. Flags change what it lists, as a server upgrade would:
`--variant N` rewrites a description, `--extra-tools N` lists N more tools,
`--test-tools` adds tools that misbehave on purpose (huge output, slow, failing).
"""

from __future__ import annotations

import argparse
import os
import socket
import time
import urllib.request

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

WARRANTIES = {
    "4821": {"item": "kettle", "months_left": 18, "covers_damage_in_transit": True},
    "4822": {"item": "toaster", "months_left": 0, "covers_damage_in_transit": False},
}


def build(variant: int, extra_tools: int, test_tools: bool) -> MCPServer:
    server = MCPServer("warranty", log_level="WARNING")
    lookup_description = "Look up the warranty of one order by its 4-digit number."
    if variant:
        lookup_description += f" (revision {variant})"

    # The annotation claims read-only; the host does not believe it.
    @server.tool(
        description=lookup_description,
        annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False),
    )
    def warranty_lookup(order_id: str) -> dict[str, object]:
        found = WARRANTIES.get(order_id)
        if found is None:
            raise ValueError(f"no warranty for order {order_id}")
        return {"order_id": order_id, **found}

    @server.tool(description="File a warranty claim for an order; returns its id.")
    def warranty_claim(order_id: str, reason: str) -> dict[str, str]:
        return {"claim_id": f"wc-{order_id}-{len(reason)}", "status": "filed"}

    for i in range(extra_tools):
        server.add_tool(lambda: "ok", name=f"extra_{i}", description=f"extra {i}")

    if test_tools:

        @server.tool(description="Return a text of n bytes.")
        def big_output(n: int) -> str:
            return "x" * n

        @server.tool(description="Where this server runs: uid, host, environment.")
        def sandbox_facts() -> dict[str, object]:
            try:
                socket.create_connection(("1.1.1.1", 53), timeout=2).close()
                network = "reachable"
            except OSError:
                network = "unreachable"
            return {
                "uid": os.getuid(),
                "hostname": socket.gethostname(),
                "environment": sorted(os.environ),
                "network": network,
            }

        @server.tool(description="GET a URL (through the sandbox's egress proxy).")
        def fetch(url: str) -> str:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    return str(response.read(10_000).decode("utf-8", "replace"))
            except OSError as exc:
                return f"refused: {exc}"

        @server.tool(description="Sleep for some seconds, then answer.")
        def slow(seconds: float) -> str:
            time.sleep(seconds)
            return "awake"

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", type=int, default=0)
    parser.add_argument("--extra-tools", type=int, default=0)
    parser.add_argument("--test-tools", action="store_true")
    args = parser.parse_args()
    build(args.variant, args.extra_tools, args.test_tools).run("stdio")


if __name__ == "__main__":
    main()
