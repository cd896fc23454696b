"""Real MCP servers for the tests: the SDK's MCPServer over streamable HTTP on a
local port (uvicorn on a thread), and a few servers that misbehave on purpose."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.types import ASGIApp, Receive, Scope, Send

from runs.mcp.servers.warranty import build

__all__ = ["HttpMcpServer", "JunkHttpServer", "build"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _RequireBearer:
    """401 unless the request carries `Authorization: Bearer <token>`; keeps the
    headers it saw."""

    def __init__(self, app: ASGIApp, token: str, seen: list[dict[str, str]]):
        self.app, self.token, self.seen = app, token, seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode(): v.decode() for k, v in scope["headers"]}
            self.seen.append(headers)
            if headers.get("authorization") != f"Bearer {self.token}":
                start = {"type": "http.response.start", "status": 401}
                await send({**start, "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"{}"})
                return
        await self.app(scope, receive, send)


class HttpMcpServer:
    """An MCPServer served over streamable HTTP on 127.0.0.1 until `stop()`."""

    def __init__(self, server: MCPServer, *, bearer: str = "") -> None:
        self.server = server
        self.port = _free_port()
        self.seen_headers: list[dict[str, str]] = []
        app: ASGIApp = server.streamable_http_app(host="127.0.0.1")
        if bearer:
            app = _RequireBearer(app, bearer, self.seen_headers)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="error"
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._uvicorn.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._uvicorn.started:
            assert time.monotonic() < deadline, "the MCP server did not start"
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def network(self) -> list[str]:
        """The entry an admin adds to let the control plane reach a local host."""
        return [f"private:127.0.0.1:{self.port}"]

    @property
    def network_hosts(self) -> list[str]:
        return [f"127.0.0.1:{self.port}"]

    def stop(self) -> None:
        self._uvicorn.should_exit = True
        self._thread.join(10)


class JunkHttpServer:
    """Answers every POST (after `hang` seconds) and GET with `body`; on `port`
    (e.g. where a real server stopped), else on any free one."""

    def __init__(
        self, body: bytes, content_type: str, *, hang: float = 0.0, port: int = 0
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                self.rfile.read(int(self.headers.get("content-length", 0)))
                if hang:
                    time.sleep(hang)
                self.send_response(200)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                self.send_response(200)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def network(self) -> list[str]:
        return [f"private:127.0.0.1:{self.port}"]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def redefine(
    server: MCPServer, name: str, fn: Callable[..., Any], description: str
) -> None:
    """The server changes a tool's definition, as an upgraded (or hostile) one may."""
    server.remove_tool(name)
    server.add_tool(fn, name=name, description=description)
