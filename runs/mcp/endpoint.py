"""What the host's MCP client works with: a server's address, its listed tools,
a call's result, and how a failure is named. No Django here."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_TOOLS = 500
_CLIP = 300
# MCP tool names: 1-128 of ASCII letters, digits, `_`, `-` and `.` (spec §2.4).
_MODEL_NAME_INVALID = re.compile(r"[^A-Za-z0-9_-]")


class PipedProcess(Protocol):
    """A started stdio server: raw fds to write to and read from, and a stop."""

    stdin: int
    stdout: int

    def stop(self, grace_seconds: float = ...) -> str:
        """End it; how it ended when that explains a failure ("" otherwise)."""
        ...


StdioFactory = Callable[[], PipedProcess]


class McpInputRequired(Exception):
    """The server asked for a person's input (`elicitation/create`) that no
    recorded answer covers: the call was stopped unfinished, to be re-run once a
    person answers (the answers are then given in order)."""

    def __init__(self, message: str, schema: dict[str, Any] | None) -> None:
        super().__init__(message)
        self.message = message
        self.schema = schema


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
    # The server's listing said its own secret back; it was taken out.
    repeated_secret: bool = False


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
