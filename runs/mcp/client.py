"""The host's MCP client: list a server's tools and call one, bounded in time and size.

Built on the official SDK (`mcp.Client`), over streamable HTTP or over a stdio
transport the caller supplies (the sandboxed one, runs/mcp/connection.py); the
transports themselves are runs/mcp/transports.py. No Django here.

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

import re
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.session import ElicitationFnT
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from runs.mcp.endpoint import (
    ListedTool,
    McpCallResult,
    McpEndpoint,
    McpFailure,
    McpInputRequired,
    PipedProcess,
    clip,
    definition_sha256,
)
from runs.mcp.transports import (
    CappedTransport,
    ResponseTooLarge,
    SizeGuard,
    check_http_target,
    piped_transport,
)

MAX_LIST_PAGES = 50
_GRACE_SECONDS = 5.0
MCP_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_T = TypeVar("_T")

# --- running the SDK with a deadline -------------------------------------------------


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        found: list[BaseException] = []
        for inner in error.exceptions:
            found.extend(_leaves(inner))
        return found
    return [error]


def _failure_of(error: BaseException, label: str, guard: SizeGuard) -> McpFailure:
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
        if isinstance(leaf, ResponseTooLarge):
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
    elicitation: ElicitationFnT | None = None,
) -> _T:
    """Open a session, run `body` on it, close it; all within the deadline.
    With `elicitation`, the client declares the capability and answers by it."""
    guard = SizeGuard(endpoint.max_response_bytes)
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
                    piped_transport(process, guard),
                    cache=None,
                    read_timeout_seconds=timeout_seconds,
                    elicitation_callback=elicitation,
                ) as client:
                    return await body(client)
            timeout = httpx2.Timeout(timeout_seconds)
            async with httpx2.AsyncClient(
                transport=CappedTransport(
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
                    streams,
                    cache=None,
                    read_timeout_seconds=timeout_seconds,
                    elicitation_callback=elicitation,
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
    asked = [
        e
        for e in _leaves(box.get("error", RuntimeError()))
        if isinstance(e, McpInputRequired)
    ]
    if asked:
        raise asked[0]
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
    elicitation_answers: Sequence[Mapping[str, Any]] = (),
) -> McpCallResult:
    """Call `name` if the server still lists it exactly as pinned; raises
    `McpFailure` (`removed`, `changed`, or a transport failure).

    The server's elicitation requests during the call are answered, in order,
    by `elicitation_answers` (accepted with that content); one beyond them
    stops the call unfinished and raises `McpInputRequired` (its message and
    requested schema), for the caller to ask a person and call again.
    """
    asked: list[McpInputRequired] = []
    used: list[int] = []  # one per elicitation request of this call
    scopes: list[anyio.CancelScope] = []

    async def elicit(
        context: Any, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        index = len(used)
        used.append(index)
        if index < len(elicitation_answers):
            return types.ElicitResult(
                action="accept", content=dict(elicitation_answers[index])
            )
        schema = getattr(params, "requested_schema", None)
        asked.append(
            McpInputRequired(
                clip(str(params.message), 4000),
                None if schema is None else dict(schema),
            )
        )
        for scope in scopes:  # the call stops here, unfinished
            scope.cancel()
        return types.ErrorData(
            code=types.INVALID_REQUEST, message="waiting for a person's answer"
        )

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
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            result = await client.call_tool(name, dict(arguments))
        if asked:
            raise asked[0]
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

    return _run_bounded(endpoint, timeout_seconds, body, elicitation=elicit)
