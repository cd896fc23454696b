"""Typed actions parsed from a model reply: tool calls or a final answer.

A model's tool calls are intent only. Arguments arrive as a string that may be
empty, half-written or not an object; such a call is kept (it needs exactly one
result) but marked with `parse_error` so it is never executed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FINISH_LENGTH = "length"


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Usage:
        data = data or {}
        return cls(
            input_tokens=int(data.get("input_tokens") or 0),
            output_tokens=int(data.get("output_tokens") or 0),
        )


@dataclass(frozen=True)
class ToolCall:
    """One proposed call. `arguments` is `{}` when `parse_error` is set."""

    call_id: str
    name: str
    arguments: Mapping[str, Any]
    raw_arguments: str
    parse_error: str | None = None

    @classmethod
    def parse(cls, call_id: str, name: str, raw_arguments: str) -> ToolCall:
        """Decode the provider's argument string; failures go to `parse_error`."""
        if raw_arguments.strip() == "":
            return cls(call_id, name, {}, raw_arguments)
        try:
            decoded = json.loads(raw_arguments)
        except json.JSONDecodeError as exc:
            return cls(
                call_id,
                name,
                {},
                raw_arguments,
                parse_error=f"arguments are not valid JSON ({exc.msg} at {exc.pos})",
            )
        except (ValueError, RecursionError):
            return cls(
                call_id, name, {}, raw_arguments, parse_error="arguments are not usable"
            )
        if not isinstance(decoded, dict):
            return cls(
                call_id,
                name,
                {},
                raw_arguments,
                parse_error="arguments must be a JSON object",
            )
        return cls(call_id, name, decoded, raw_arguments)

    @property
    def arguments_sha256(self) -> str:
        """Hash of the canonical arguments: an approval is for exactly these."""
        canonical = json.dumps(
            dict(self.arguments),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def truncated(self) -> ToolCall:
        """This call marked unexecutable because the reply hit its length limit."""
        return ToolCall(
            self.call_id,
            self.name,
            {},
            self.raw_arguments,
            parse_error=(
                "the reply was cut off at the output limit (finish_reason=length), "
                "so the arguments may be incomplete; nothing was executed"
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "name": self.name,
            "arguments": dict(self.arguments),
            "raw_arguments": self.raw_arguments,
            "parse_error": self.parse_error,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolCall:
        return cls(
            call_id=str(data["call_id"]),
            name=str(data["name"]),
            arguments=dict(data.get("arguments") or {}),
            raw_arguments=str(data.get("raw_arguments", "")),
            parse_error=data.get("parse_error"),
        )

    def to_message_dict(self) -> dict[str, Any]:
        """The call as it appears in an assistant message (arguments verbatim)."""
        return {
            "id": self.call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.raw_arguments},
        }


@dataclass(frozen=True)
class ModelReply:
    """Everything recorded about one model call."""

    tool_calls: tuple[ToolCall, ...] = ()
    text: str | None = None
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    provider: str = ""
    provider_request_id: str | None = None
    response_id: str | None = None
    raw: Mapping[str, Any] | None = None
    attempts: int = 1
    # Which endpoint answered, the circuit's state, a fallback's reason
    # (adapters/breaker.py); None for a call made without a breaker.
    routing: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "tool_calls": [call.to_dict() for call in self.tool_calls],
            "text": self.text,
            "finish_reason": self.finish_reason,
            "usage": self.usage.to_dict(),
            "model": self.model,
            "provider": self.provider,
            "provider_request_id": self.provider_request_id,
            "response_id": self.response_id,
            "raw": None if self.raw is None else dict(self.raw),
            "attempts": self.attempts,
        }
        if self.routing is not None:
            data["routing"] = dict(self.routing)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelReply:
        raw = data.get("raw")
        return cls(
            tool_calls=tuple(ToolCall.from_dict(c) for c in data.get("tool_calls", ())),
            text=data.get("text"),
            finish_reason=str(data.get("finish_reason", "stop")),
            usage=Usage.from_dict(data.get("usage")),
            model=str(data.get("model", "")),
            provider=str(data.get("provider", "")),
            provider_request_id=data.get("provider_request_id"),
            response_id=data.get("response_id"),
            raw=None if raw is None else dict(raw),
            attempts=int(data.get("attempts", 1)),
            routing=data.get("routing"),
        )


@dataclass(frozen=True)
class ToolCallsAction:
    """Run these calls serially, in order; each gets exactly one result."""

    calls: tuple[ToolCall, ...]
    text: str | None = None  # text next to tool calls is not a final answer


@dataclass(frozen=True)
class FinalAnswer:
    """The model says it is finished. The host, not the model, decides `done`."""

    text: str


@dataclass(frozen=True)
class InvalidReply:
    """A reply with nothing to execute and no usable answer (e.g. cut-off text)."""

    reason: str


Action = ToolCallsAction | FinalAnswer | InvalidReply


def decode_reply(reply: ModelReply) -> Action:
    """Interpret a model reply as the action the host will carry out.

    `finish_reason == "length"` marks every call unexecutable; a duplicate call id
    keeps the first call only.
    """
    truncated = reply.finish_reason == FINISH_LENGTH
    if reply.tool_calls:
        seen: set[str] = set()
        calls: list[ToolCall] = []
        for call in reply.tool_calls:
            if call.call_id in seen:
                continue
            seen.add(call.call_id)
            calls.append(call.truncated() if truncated else call)
        return ToolCallsAction(calls=tuple(calls), text=reply.text)
    if truncated:
        return InvalidReply(
            "EINVAL: your reply was cut off at the output limit (finish_reason="
            "length) and was not accepted; answer again more briefly"
        )
    if reply.text is None or not reply.text.strip():
        return InvalidReply(
            "EINVAL: your reply had neither a tool call nor an answer; "
            "call a tool or give the final answer"
        )
    return FinalAnswer(text=reply.text)
