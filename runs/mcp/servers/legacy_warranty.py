"""A 2025-era MCP server over stdio, written without the SDK: it knows only the
`initialize` handshake (protocol 2025-11-25), so `server/discover` is a method it
has never heard of (-32601). The host's client must recognise it and fall back to
the handshake (spec §2.5, §2.9: the 2026 client x 2025-only server cell).

Frames are one JSON object a line on stdout, nothing else there (spec §2.6.1);
it stops when stdin closes. Standard library only, so it runs in the sandbox as is.
"""

from __future__ import annotations

import json
import sys
from typing import Any

VERSION = "2025-11-25"
WARRANTIES = {"4821": {"item": "kettle", "months_left": 18}}
LOOKUP = {
    "name": "warranty_lookup",
    "description": "Look up the warranty of one order by its 4-digit number.",
    "inputSchema": {
        "type": "object",
        "properties": {"order_id": {"type": "string", "pattern": "^[0-9]{4}$"}},
        "required": ["order_id"],
        "additionalProperties": False,
    },
}


def write(frame: dict[str, Any]) -> None:
    line = json.dumps(frame, ensure_ascii=False, separators=(",", ":"))
    assert "\n" not in line
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def error(request_id: Any, code: int, message: str) -> None:
    write(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "error": {"code": code, "message": message},
        }
    )


def call(params: dict[str, Any], negotiated: str) -> dict[str, Any]:
    arguments = params.get("arguments") or {}
    found = WARRANTIES.get(str(arguments.get("order_id")))
    if found is None:
        text = f"no warranty for order {arguments.get('order_id')}"
        return {"content": [{"type": "text", "text": text}], "isError": True}
    data = {"order_id": arguments["order_id"], **found, "protocol": negotiated}
    return {
        "content": [{"type": "text", "text": json.dumps(data)}],
        "structuredContent": data,
        "isError": False,
    }


def serve() -> None:
    negotiated = ""
    initialized = False
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            frame = json.loads(line)
        except ValueError:
            error(None, -32700, "Parse error")
            continue
        method, request_id = frame.get("method"), frame.get("id")
        params = frame.get("params") or {}
        if request_id is None:  # a notification: never answered
            initialized = initialized or method == "notifications/initialized"
            continue
        if method == "initialize":
            negotiated = VERSION
            write({"jsonrpc": "2.0", "id": request_id, "result": {
                "protocolVersion": negotiated,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "legacy-warranty", "version": "1.0.0"},
            }})  # fmt: skip
        elif method == "ping":
            write({"jsonrpc": "2.0", "id": request_id, "result": {}})
        elif method not in ("tools/list", "tools/call"):
            error(request_id, -32601, f"Method not found: {method}")
        elif not (negotiated and initialized):
            error(request_id, -32600, "Invalid Request: initialize first")
        elif method == "tools/list":
            write({"jsonrpc": "2.0", "id": request_id, "result": {"tools": [LOOKUP]}})
        elif params.get("name") != LOOKUP["name"]:
            error(request_id, -32602, f"Unknown tool: {params.get('name')}")
        else:
            write(
                {"jsonrpc": "2.0", "id": request_id, "result": call(params, negotiated)}
            )


if __name__ == "__main__":
    serve()
