"""The MCP client's transports: an HTTP server reached only at a checked address,
with responses capped while they are read, and stdio over a sandboxed process's
pipes. No Django here."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import httpcore2
import httpx2
import mcp_types as types
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage

from runs.mcp.endpoint import McpFailure, PipedProcess

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


class ResponseTooLarge(Exception):
    pass


class SizeGuard:
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
                raise ResponseTooLarge()
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


class CappedTransport(httpx2.AsyncBaseTransport):
    """Stops reading a response body past `cap` bytes (the SDK buffers JSON
    responses whole); connects through `_CheckedBackend`."""

    def __init__(
        self, guard: SizeGuard, allowed_private: Sequence[str], label: str
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
            raise ResponseTooLarge()
        response.stream = _CappedStream(
            response.stream, self._guard.cap, self._guard.over
        )
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


# --- stdio over a piped process ------------------------------------------------------


@asynccontextmanager
async def piped_transport(
    process: PipedProcess, guard: SizeGuard
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
