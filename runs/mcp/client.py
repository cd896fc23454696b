"""The host's MCP client: list a server's tools and call one, bounded in time and size.

Built on the official SDK (`mcp.Client`), over streamable HTTP or over a stdio
transport the caller supplies (the sandboxed one, runs/mcp/stdio.py). No Django here.

Every entry point runs the SDK's event loop in a thread of its own and waits for it
at most the deadline plus a short grace: a server that never answers, answers
slowly or answers garbage costs the caller one deadline, never a stuck worker.
Responses are capped while they are read (a 50 MB result is refused after the
first few MB arrive, never buffered), and so is the number of tools a server may
list. Failures are `McpFailure`s whose messages name the server and what went
wrong, never a header value, a stack trace or the server's own error text
beyond a short clip.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import httpcore2
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_TOOLS = 500
MAX_LIST_PAGES = 50
_GRACE_SECONDS = 5.0
_CLIP = 300
# MCP tool names: 1-128 of ASCII letters, digits, `_`, `-` and `.` (spec §2.4).
MCP_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_MODEL_NAME_INVALID = re.compile(r"[^A-Za-z0-9_-]")

_T = TypeVar("_T")


class PipedProcess(Protocol):
    """A started stdio server: raw fds to write to and read from, and a stop."""

    stdin: int
    stdout: int

    def stop(self, grace_seconds: float = ...) -> str:
        """End it; how it ended when that explains a failure ("" otherwise)."""
        ...


StdioFactory = Callable[[], PipedProcess]


class McpFailure(Exception):
    """An MCP server could not be used; `kind` says how, for the error mapping.

    Kinds: `refused` (the address may not be reached), `unreachable`, `timeout`,
    `too_large`, `too_many_tools`, `garbage` (not MCP), `protocol` (a JSON-RPC
    error, `code` set), `removed` and `changed` (the tool is not what was pinned).
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        code: int | None = None,
        listing: list[ListedTool] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code
        self.listing = listing  # `removed`, `changed`: what the server lists now


@dataclass(frozen=True)
class McpEndpoint:
    """Where and how to reach one server; `headers` may carry a secret: never shown."""

    label: str  # "MCP server 'files'": how messages name it
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    stdio: StdioFactory | None = None
    # "host:port" a URL may name although it resolves to a private address.
    allowed_private: Sequence[str] = ()
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    max_tools: int = DEFAULT_MAX_TOOLS


@dataclass(frozen=True)
class ListedTool:
    """One tool as the server lists it; `annotations` are untrusted hints."""

    name: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]
    definition_sha256: str


@dataclass(frozen=True)
class McpCallResult:
    is_error: bool
    text: str  # the text blocks, joined
    content: list[dict[str, Any]]  # every block, binary payloads left out
    structured: Any = None


def definition_sha256(name: str, description: str, input_schema: Any) -> str:
    """The pin of a tool definition: sha256 of its canonical JSON (name,
    description, input schema)."""
    payload = json.dumps(
        {"name": name, "description": description, "input_schema": input_schema},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def mcp_model_name(server_slug: str, tool_name: str) -> str:
    """The name the model sees: `<server>_<tool>`, sanitised to
    `^[A-Za-z0-9_-]{1,64}$`; when that changes or shortens it, a hash of the
    original keeps it unique."""
    raw = f"{server_slug}_{tool_name}"
    clean = _MODEL_NAME_INVALID.sub("_", raw)
    if clean == raw and len(clean) <= 64:
        return clean
    digest = hashlib.sha256(raw.encode("utf-8")).hexdigest()[:8]
    return f"{clean[:55]}_{digest}"


def clip(text: str, limit: int = _CLIP) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- where an HTTP server may be ---------------------------------------------------


def check_http_target(
    url: str, allowed_private: Sequence[str] = (), *, label: str = "the server"
) -> None:
    """Refuse a URL that is not plain http(s) or whose host resolves to a private,
    loopback or link-local address not listed in `allowed_private` (SSRF). The
    connection itself checks the address it connects to again (`_CheckedBackend`):
    a name that resolves differently a moment later gains nothing."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise McpFailure("refused", f"{label}: the URL must be http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise McpFailure(
            "refused",
            f"{label}: put credentials in a secret, not in the URL",
        )
    host = parts.hostname.lower().rstrip(".")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise McpFailure("refused", f"{label}: the URL's port is invalid") from None
    checked_addresses(host, port, allowed_private, label=label)


def _listed_private(host: str, port: int, allowed_private: Sequence[str]) -> bool:
    listed = {entry.lower() for entry in allowed_private}
    return f"{host}:{port}" in listed or f"[{host}]:{port}" in listed


def checked_addresses(
    host: str, port: int, allowed_private: Sequence[str], *, label: str
) -> list[str]:
    """The addresses `host` resolves to, all of them public unless `host:port` is
    listed as private; McpFailure otherwise."""
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        raise McpFailure(
            "unreachable", f"{label}: the host {host!r} does not resolve"
        ) from None
    addresses = list(dict.fromkeys(str(info[4][0]).split("%")[0] for info in infos))
    if _listed_private(host, port, allowed_private):
        return addresses
    for text in addresses:
        address = ipaddress.ip_address(text)
        if not address.is_global:
            raise McpFailure(
                "refused",
                f"{label}: {host}:{port} is a private, loopback or link-local "
                f"address ({address}); an admin must list private:{host}:{port} "
                "in the server's network to allow it",
            )
    return addresses


# --- bounded HTTP --------------------------------------------------------------------


class _ResponseTooLarge(Exception):
    pass


class _SizeGuard:
    """Remembers that a response went over the cap, whatever the SDK made of the
    error it caused (a closed connection, a failed request)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.exceeded = False
        self.garbage = False  # a stdio line that is not JSON-RPC
        self.http_status = 0  # the last HTTP error status (the SDK drops it)

    def over(self) -> None:
        self.exceeded = True


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, cap: int, over: Callable[[], None]) -> None:
        self._inner = inner
        self._cap = cap
        self._over = over

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self._inner:
            total += len(chunk)
            if total > self._cap:
                self._over()
                raise _ResponseTooLarge()
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CheckedBackend(httpcore2.AsyncNetworkBackend):
    """Connects only to an address checked at connection time (no DNS
    rebinding between the URL's check and the connection)."""

    def __init__(self, allowed_private: Sequence[str], label: str) -> None:
        self._inner = httpcore2.AnyIOBackend()
        self._allowed = allowed_private
        self._label = label

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore2.AsyncNetworkStream:
        addresses = await anyio.to_thread.run_sync(
            lambda: checked_addresses(
                host.lower().rstrip("."), port, self._allowed, label=self._label
            )
        )
        # TLS still verifies the name: the connection starts it with the URL's
        # host, whatever address it dialled.
        return await self._inner.connect_tcp(
            addresses[0],
            port,
            timeout=timeout,
            local_address=local_address,
            socket_options=socket_options,
        )

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore2.AsyncNetworkStream:
        raise McpFailure("refused", f"{self._label}: no unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _CappedTransport(httpx2.AsyncBaseTransport):
    """Stops reading a response body past `cap` bytes (the SDK buffers JSON
    responses whole); connects through `_CheckedBackend`."""

    def __init__(
        self, guard: _SizeGuard, allowed_private: Sequence[str], label: str
    ) -> None:
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)
        # httpx2 takes no network backend: its pool is replaced by the same one
        # with ours (what AsyncHTTPTransport builds without a proxy).
        self._inner._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(trust_env=False),
            network_backend=_CheckedBackend(allowed_private, label),
        )
        self._guard = guard

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.status_code >= 400 and request.method == "POST":
            self._guard.http_status = response.status_code
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._guard.cap:
            self._guard.over()
            await response.aclose()
            raise _ResponseTooLarge()
        response.stream = _CappedStream(
            response.stream, self._guard.cap, self._guard.over
        )
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


# --- stdio over a piped process ------------------------------------------------------


@asynccontextmanager
async def _piped_transport(
    process: PipedProcess, guard: _SizeGuard
) -> AsyncIterator[TransportStreams]:
    """Newline-delimited JSON-RPC over the process's pipes (spec §2.6.1), read
    without blocking a thread and without buffering a line past the cap."""
    read_writer, read_stream = anyio.create_memory_object_stream[
        SessionMessage | Exception
    ](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    os.set_blocking(process.stdout, False)
    os.set_blocking(process.stdin, False)

    async def reader() -> None:
        buffer = b""
        async with read_writer:
            while True:
                await anyio.wait_readable(process.stdout)
                try:
                    chunk = os.read(process.stdout, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    return  # the server exited or closed its stdout
                lines = (buffer + chunk).split(b"\n")
                buffer = lines.pop()
                if len(buffer) > guard.cap:
                    guard.over()
                    return
                for line in lines:
                    if len(line) > guard.cap:
                        guard.over()
                        return
                    if not line.strip():
                        continue
                    try:
                        parsed = types.jsonrpc_message_adapter.validate_json(
                            line, by_name=False
                        )
                    except ValueError:
                        # stdout carries protocol frames only (spec §2.6.1): a
                        # server printing anything else is not speaking MCP.
                        guard.garbage = True
                        return
                    await read_writer.send(SessionMessage(parsed))

    async def writer() -> None:
        async with write_reader:
            async for message in write_reader:
                data = (
                    message.message.model_dump_json(
                        by_alias=True, exclude_unset=True
                    ).encode()
                    + b"\n"
                )
                view = memoryview(data)
                while view:
                    await anyio.wait_writable(process.stdin)
                    try:
                        view = view[os.write(process.stdin, view) :]
                    except BlockingIOError:
                        continue

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(reader)
            tasks.start_soon(writer)
            try:
                yield read_stream, write_stream
            finally:
                tasks.cancel_scope.cancel()
    finally:
        await read_stream.aclose()
        await write_stream.aclose()


# --- running the SDK with a deadline -------------------------------------------------


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        found: list[BaseException] = []
        for inner in error.exceptions:
            found.extend(_leaves(inner))
        return found
    return [error]


def _failure_of(error: BaseException, label: str, guard: _SizeGuard) -> McpFailure:
    if guard.exceeded:
        return McpFailure(
            "too_large",
            f"{label} sent a response larger than {guard.cap} bytes; it was "
            "refused unread",
        )
    leaves = _leaves(error)
    for leaf in leaves:
        if isinstance(leaf, McpFailure):
            return leaf
    if guard.garbage:
        return McpFailure(
            "garbage", f"{label} wrote something that is not MCP to its stdout"
        )
    if guard.http_status in (401, 403):
        return McpFailure(
            "refused",
            f"{label} refused the request (HTTP {guard.http_status}): check the "
            "server's auth secret",
        )
    if guard.http_status >= 400:
        return McpFailure("unreachable", f"{label} answered HTTP {guard.http_status}")
    for leaf in leaves:
        if isinstance(leaf, _ResponseTooLarge):
            return McpFailure("too_large", f"{label} sent a response that is too large")
        if isinstance(leaf, TimeoutError):
            return McpFailure("timeout", f"{label} did not answer in time")
        if isinstance(leaf, MCPError):
            message = clip(str(leaf.error.message or ""))
            if leaf.error.code in (types.PARSE_ERROR, types.INVALID_REQUEST):
                # Raised by the SDK itself for a body that is not JSON-RPC.
                return McpFailure(
                    "garbage",
                    f"{label} answered with something that is not MCP "
                    f"({clip(message, 120)})",
                    code=leaf.error.code,
                )
            if leaf.error.code in (types.CONNECTION_CLOSED, types.INTERNAL_ERROR):
                return McpFailure(
                    "unreachable",
                    f"{label} closed the connection or failed ({message})",
                    code=leaf.error.code,
                )
            return McpFailure(
                "protocol",
                f"{label} answered with error {leaf.error.code}: {message}",
                code=leaf.error.code,
            )
        if isinstance(leaf, httpx2.TimeoutException):
            return McpFailure("timeout", f"{label} did not answer in time")
        if isinstance(leaf, httpx2.TransportError | OSError):
            return McpFailure(
                "unreachable", f"{label} could not be reached ({type(leaf).__name__})"
            )
        if isinstance(leaf, httpx2.HTTPStatusError):
            return McpFailure(
                "unreachable",
                f"{label} answered HTTP {leaf.response.status_code}",
            )
        if isinstance(leaf, ValidationError | ValueError | KeyError | TypeError):
            return McpFailure(
                "garbage", f"{label} answered with something that is not MCP"
            )
    first = leaves[0] if leaves else error
    return McpFailure("garbage", f"{label} failed ({type(first).__name__})")


def _run_bounded(
    endpoint: McpEndpoint,
    timeout_seconds: float,
    body: Callable[[Client], Awaitable[_T]],
) -> _T:
    """Open a session, run `body` on it, close it; all within the deadline."""
    guard = _SizeGuard(endpoint.max_response_bytes)
    if endpoint.stdio is None:
        check_http_target(endpoint.url, endpoint.allowed_private, label=endpoint.label)
    processes: list[PipedProcess] = []
    endings: list[str] = []

    async def session() -> _T:
        with anyio.fail_after(timeout_seconds):
            if endpoint.stdio is not None:
                try:
                    process = endpoint.stdio()
                except Exception as exc:  # noqa: BLE001 - the sandbox said why
                    raise McpFailure(
                        "unreachable",
                        f"{endpoint.label} could not be started "
                        f"({type(exc).__name__}: {clip(str(exc), 200)})",
                    ) from None
                processes.append(process)
                async with Client(
                    _piped_transport(process, guard),
                    cache=None,
                    read_timeout_seconds=timeout_seconds,
                ) as client:
                    return await body(client)
            timeout = httpx2.Timeout(timeout_seconds)
            async with httpx2.AsyncClient(
                transport=_CappedTransport(
                    guard, endpoint.allowed_private, endpoint.label
                ),
                headers=dict(endpoint.headers),
                timeout=timeout,
                trust_env=False,
            ) as http:
                streams = streamable_http_client(
                    endpoint.url,
                    http_client=http,
                    max_sse_event_size=endpoint.max_response_bytes,
                )
                async with Client(
                    streams, cache=None, read_timeout_seconds=timeout_seconds
                ) as client:
                    return await body(client)

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = anyio.run(session)
        except BaseException as exc:  # noqa: BLE001 - classified by the caller
            box["error"] = exc
        finally:
            for process in processes:
                # Close stdin, a grace to exit, then the whole tree is killed.
                endings.append(process.stop(1.0))

    worker = threading.Thread(target=target, name="mcp-client", daemon=True)
    worker.start()
    worker.join(timeout_seconds + _GRACE_SECONDS)
    if worker.is_alive():
        raise McpFailure("timeout", f"{endpoint.label} did not answer in time")
    if "error" in box or guard.exceeded or guard.garbage:
        failure = _failure_of(box.get("error", RuntimeError()), endpoint.label, guard)
        ended = "; ".join(e for e in endings if e)
        if ended and failure.kind in ("unreachable", "garbage"):
            failure = McpFailure(
                failure.kind, f"{failure} ({clip(ended, 300)})", code=failure.code
            )
        raise failure
    return box["value"]  # type: ignore[no-any-return]


# --- listing and calling -------------------------------------------------------------


def _listed(tool: types.Tool, label: str) -> ListedTool:
    if not MCP_TOOL_NAME.match(tool.name):
        raise McpFailure(
            "garbage",
            f"{label} lists a tool with an invalid name {clip(tool.name, 60)!r}",
        )
    description = tool.description or ""
    schema = dict(tool.input_schema or {})
    annotations = (
        {}
        if tool.annotations is None
        else tool.annotations.model_dump(by_alias=True, exclude_none=True, mode="json")
    )
    return ListedTool(
        name=tool.name,
        description=description,
        input_schema=schema,
        annotations=annotations,
        definition_sha256=definition_sha256(tool.name, description, schema),
    )


async def _list_all(client: Client, endpoint: McpEndpoint) -> list[ListedTool]:
    tools: list[ListedTool] = []
    seen: set[str] = set()
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        if len(tools) + len(page.tools) > endpoint.max_tools:
            raise McpFailure(
                "too_many_tools",
                f"{endpoint.label} lists more than {endpoint.max_tools} tools; "
                "the host accepts at most that many from one server",
            )
        for tool in page.tools:
            listed = _listed(tool, endpoint.label)
            if listed.name in seen:
                raise McpFailure(
                    "garbage", f"{endpoint.label} lists {listed.name!r} twice"
                )
            seen.add(listed.name)
            tools.append(listed)
        cursor = page.next_cursor
        if not cursor:
            return tools
    raise McpFailure(
        "too_many_tools",
        f"{endpoint.label}'s tool list has more than {MAX_LIST_PAGES} pages",
    )


def mcp_list_tools(
    endpoint: McpEndpoint, *, timeout_seconds: float
) -> list[ListedTool]:
    """Every tool the server lists (all pages); raises `McpFailure`."""

    async def body(client: Client) -> list[ListedTool]:
        return await _list_all(client, endpoint)

    return _run_bounded(endpoint, timeout_seconds, body)


def _block(block: Any) -> dict[str, Any]:
    data: dict[str, Any] = block.model_dump(
        by_alias=True, exclude_none=True, mode="json"
    )
    kind = data.get("type")
    if kind in ("image", "audio"):
        # Binary payloads are not shown to the model; their size is.
        payload = data.pop("data", "")
        data["bytes"] = len(payload) * 3 // 4
    elif kind == "resource":
        resource = data.get("resource") or {}
        if "blob" in resource:
            resource["bytes"] = len(resource.pop("blob")) * 3 // 4
    return data


def mcp_call_tool(
    endpoint: McpEndpoint,
    name: str,
    arguments: Mapping[str, Any],
    *,
    timeout_seconds: float,
    pinned_sha256: str,
) -> McpCallResult:
    """Call `name` if the server still lists it exactly as pinned; raises
    `McpFailure` (`removed`, `changed`, or a transport failure)."""

    async def body(client: Client) -> McpCallResult:
        # The server is asked what the tool is now, in the same session as the
        # call: a definition changed since it was accepted is never called.
        listed = {tool.name: tool for tool in await _list_all(client, endpoint)}
        current = listed.get(name)
        if current is None:
            raise McpFailure(
                "removed",
                f"{endpoint.label} no longer lists the tool {name!r}",
                listing=list(listed.values()),
            )
        if current.definition_sha256 != pinned_sha256:
            raise McpFailure(
                "changed",
                f"{endpoint.label} changed the definition of {name!r} since an "
                "admin accepted it",
                listing=list(listed.values()),
            )
        result = await client.call_tool(name, dict(arguments))
        blocks = [_block(block) for block in result.content]
        text = "\n".join(
            str(block.get("text", ""))
            for block in blocks
            if block.get("type") == "text"
        )
        return McpCallResult(
            is_error=bool(result.is_error),
            text=text,
            content=blocks,
            structured=result.structured_content,
        )

    return _run_bounded(endpoint, timeout_seconds, body)
