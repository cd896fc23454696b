"""A 2025-11-25 MCP server over stdio, without the SDK, whose tool asks the client
mid-call (`elicitation/create`, a server-to-client request) and writes only if
the answer accepts with `confirm: true`. Every answer it receives goes to stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

TOOL = {
    "name": "confirm_write",
    "description": "Write a file after asking the user.",
    "inputSchema": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
}
ASK = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean"}},
    "required": ["confirm"],
}


def write(frame: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(frame, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def reply(request: dict[str, Any], result: dict[str, Any]) -> None:
    write({"jsonrpc": "2.0", "id": request["id"], "result": result})


def main() -> None:
    call: dict[str, Any] | None = None
    for line in sys.stdin:
        message = json.loads(line)
        method = message.get("method")
        if method == "initialize":
            reply(message, {
                "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                "serverInfo": {"name": "legacy-elicit", "version": "1"},
            })  # fmt: skip
        elif method == "tools/list":
            reply(message, {"tools": [TOOL]})
        elif method == "tools/call":
            call = message
            path = message["params"]["arguments"]["path"]
            write({
                "jsonrpc": "2.0", "id": "ask-1", "method": "elicitation/create",
                "params": {"mode": "form", "message": f"Write {path}?",
                           "requestedSchema": ASK},
            })  # fmt: skip
        elif method is not None and "id" in message:
            write({
                "jsonrpc": "2.0", "id": message["id"],
                "error": {"code": -32601, "message": "Method not found"},
            })  # fmt: skip
        elif method is None and call is not None:  # the client's answer
            sys.stderr.write(f"answer {json.dumps(message)}\n")
            result = message.get("result") or {}
            content = result.get("content") or {}
            done = result.get("action") == "accept" and content.get("confirm") is True
            text = "written" if done else "not written"
            reply(call, {"content": [{"type": "text", "text": text}]})
            call = None


if __name__ == "__main__":
    main()
