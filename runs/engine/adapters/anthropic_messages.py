"""The `anthropic` adapter: the Messages API through the official `anthropic` SDK.

Our transcript is in OpenAI chat format (transcript.py); this module maps it to
Messages and back:
- `system` messages become the `system` parameter;
- an assistant turn's tool calls become `tool_use` blocks (input: the decoded
  arguments; arguments that did not decode are sent as `{}`, their error result
  says why), `tool` messages become `tool_result` blocks of a user turn;
- consecutive turns of one role are merged (Messages alternates roles), a tool
  result block first in its user turn;
- tools become `{name, description, input_schema}`; serial tool use is asked
  with `disable_parallel_tool_use`.

Back: text blocks joined, `tool_use` blocks as tool calls (their input JSON
verbatim as the raw arguments), stop reasons `end_turn`/`stop_sequence` →
`stop`, `tool_use` → `tool_calls`, `max_tokens`/`model_context_window_exceeded`
→ `length`, `refusal` → `content_filter`. Usage is the provider's: input tokens
count the cached and cache-writing ones too (the budget counts what was sent),
output tokens are message_delta's cumulative count. A stream that ends without
a stop reason gets zero usage if it also missed message_start, and the host then
charges the reservation (`billable_usage`).

Errors share the OpenAI adapter's rules (retrying.py): 429 (with `retry-after`),
529 overloaded, 5xx and timeouts are retried; 401/403 are `auth`, 402 is
`quota_exhausted`, other 4xx `bad_request`, none retried. An `error` event in the
stream (`overloaded_error`, `api_error`) is classified by its type.

The client never reads credentials from the environment or a profile (the key
is passed, even when empty) and makes no OpenTelemetry spans or trace headers of
its own: our chat span records the call.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anthropic
import httpx2

from runs.engine.actions import ModelReply, ToolCall, Usage
from runs.engine.adapters import DeltaSink
from runs.engine.adapters.retrying import (
    Failure,
    RetryingAdapter,
    StreamDeadline,
    StreamInterrupted,
    ToolCallBuffer,
    Watchdog,
    retry_after_seconds,
)

STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}
TRANSIENT_TYPES = {
    "overloaded_error": "overloaded",
    "api_error": "server",
    "rate_limit_error": "rate_limited",
    "timeout_error": "timeout",
}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict)
        )
    return str(content)


def _tool_input(raw: str) -> dict[str, Any]:
    try:
        decoded = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        return {}
    return decoded if isinstance(decoded, dict) else {}


def to_anthropic(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[str, list[dict[str, Any]]]:
    """(system prompt, Messages turns) for a transcript in chat format."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if turns and turns[-1]["role"] == role:
            merged = turns[-1]["content"] + blocks
            # Tool results lead their user turn.
            merged.sort(key=lambda block: block.get("type") != "tool_result")
            turns[-1]["content"] = merged
        else:
            turns.append({"role": role, "content": blocks})

    for message in messages:
        role = message.get("role")
        if role == "system":
            text = _text(message.get("content"))
            if text:
                system.append(text)
        elif role == "user":
            text = _text(message.get("content"))
            add("user", [{"type": "text", "text": text}] if text else [])
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            text = _text(message.get("content"))
            if text:
                blocks.append({"type": "text", "text": text})
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": str(call.get("id")),
                        "name": str(function.get("name")),
                        "input": _tool_input(str(function.get("arguments") or "")),
                    }
                )
            add("assistant", blocks)
        elif role == "tool":
            content = _text(message.get("content"))
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": str(message.get("tool_call_id")),
                "content": content,
            }
            if _is_error_result(content):
                block["is_error"] = True
            add("user", [block])
    return "\n\n".join(system), turns


def _is_error_result(content: str) -> bool:
    """Our result envelope says `ok: false` for a failed call."""
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):
        return False
    return isinstance(body, dict) and body.get("ok") is False


def to_anthropic_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for tool in tools:
        function = tool.get("function") or tool
        entry: dict[str, Any] = {
            "name": function["name"],
            "input_schema": function.get("parameters")
            or {"type": "object", "properties": {}},
        }
        if function.get("description"):
            entry["description"] = function["description"]
        out.append(entry)
    return out


def classify_error(exc: Exception) -> tuple[str, bool]:
    """(kind, transient) for an SDK exception."""
    if isinstance(exc, anthropic.APITimeoutError | httpx2.TimeoutException):
        return "timeout", True
    if isinstance(exc, anthropic.APIConnectionError):
        return "connection", True
    if isinstance(exc, httpx2.TransportError):
        return "stream_interrupted", True
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        kind = str(getattr(exc, "type", "") or "")
        if status < 400:  # an `error` event inside a 200 stream
            return TRANSIENT_TYPES.get(kind, "server"), True
        if status == 429:
            return "rate_limited", True
        if status == 529 or kind == "overloaded_error":
            return "overloaded", True
        if status in (401, 403):
            return "auth", False
        if status == 402:
            return "quota_exhausted", False
        if status == 408 or status >= 500:
            return "server", True
        return "bad_request", False
    if isinstance(exc, anthropic.APIResponseValidationError):
        return "bad_response", False
    return "unexpected", False


def _safe_message(exc: Exception) -> str:
    if isinstance(exc, anthropic.APIStatusError):
        message = getattr(exc, "api_message", None) or "error"
        if exc.status_code < 400:
            return f"error in the stream: {message}"[:500]
        return f"HTTP {exc.status_code}: {message}"[:500]
    return type(exc).__name__


class AnthropicModel(RetryingAdapter):
    """A Claude model behind the Messages API (or a server speaking it)."""

    provider_name = "anthropic"

    def __init__(
        self,
        *,
        model: str,
        api_key: str,
        base_url: str | None = None,
        parallel_tool_calls: bool = False,
        client: anthropic.Anthropic | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(model=model, **settings)
        self.parallel_tool_calls = parallel_tool_calls
        self.own_secret = api_key
        self._client = client or anthropic.Anthropic(
            api_key=api_key,
            base_url=base_url,
            timeout=self.timeout_seconds,
            max_retries=0,
            open_telemetry={"traces": False, "propagation": False},
        )

    def _request(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        max_output_tokens: int,
    ) -> dict[str, Any]:
        system, turns = to_anthropic(messages)
        request: dict[str, Any] = {
            "model": self.model,
            "messages": turns,
            "max_tokens": max_output_tokens,
        }
        if system:
            request["system"] = system
        if tools:
            request["tools"] = to_anthropic_tools(tools)
            request["tool_choice"] = {
                "type": "auto",
                "disable_parallel_tool_use": not self.parallel_tool_calls,
            }
        return request

    def _classify(self, exc: Exception) -> Failure | None:
        if not isinstance(exc, anthropic.AnthropicError | httpx2.HTTPError):
            return None
        kind, transient = classify_error(exc)
        status = None
        request_id = None
        retry_after = None
        if isinstance(exc, anthropic.APIStatusError):
            status = exc.status_code
            request_id = exc.request_id
            retry_after = retry_after_seconds(exc.response.headers, time.time())
        return Failure(
            kind,
            transient,
            _safe_message(exc),
            status_code=status,
            request_id=request_id,
            retry_after=retry_after,
        )

    def _attempt(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        max_output_tokens: int,
        *,
        timeout: float,
        deadline: float,
        attempts: int,
        on_delta: DeltaSink | None,
    ) -> ModelReply:
        request = self._request(messages, tools, max_output_tokens)
        if not self.stream:
            raw = self._client.messages.with_raw_response.create(
                **request, timeout=timeout
            )
            message = raw.parse()
            return self._reply(
                message.model_dump(mode="json"), raw.headers.get("request-id"), attempts
            )
        raw = self._client.messages.with_raw_response.create(
            **request, stream=True, timeout=timeout
        )
        request_id = raw.headers.get("request-id")
        stream = raw.parse()
        watchdog = Watchdog(deadline - self._clock(), stream.close)
        assembled = _Assembly()
        try:
            with watchdog.running():
                for event in stream:
                    text = assembled.add(event)
                    if text and on_delta is not None:
                        on_delta(text)
                    if self._clock() >= deadline:
                        raise StreamDeadline()
        except Exception as exc:
            raise _stream_error(exc, watchdog, assembled.events) from None
        finally:
            stream.close()
        if watchdog.fired:
            raise StreamDeadline()
        if assembled.stop_reason is None:
            raise StreamInterrupted(
                f"the stream ended after {assembled.events} events without a "
                "stop reason"
            )
        return self._reply(assembled.message(self.model), request_id, attempts)

    def _reply(
        self, message: Mapping[str, Any], request_id: str | None, attempts: int
    ) -> ModelReply:
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in message.get("content") or []:
            if block.get("type") == "text":
                texts.append(str(block.get("text") or ""))
            elif block.get("type") == "tool_use":
                raw_input = block.get("raw_input")
                if raw_input is None:
                    raw_input = json.dumps(block.get("input") or {})
                calls.append(
                    ToolCall.parse(str(block["id"]), str(block["name"]), raw_input)
                )
        usage = message.get("usage") or {}
        stop = str(message.get("stop_reason") or "end_turn")
        return ModelReply(
            tool_calls=tuple(calls),
            text="".join(texts) or None,
            finish_reason=STOP_REASONS.get(stop, stop),
            usage=Usage(
                input_tokens=int(usage.get("input_tokens") or 0)
                + int(usage.get("cache_creation_input_tokens") or 0)
                + int(usage.get("cache_read_input_tokens") or 0),
                output_tokens=int(usage.get("output_tokens") or 0),
            ),
            model=str(message.get("model") or self.model),
            provider=self.provider,
            provider_request_id=request_id or message.get("id"),
            response_id=message.get("id"),
            raw=dict(message),
            attempts=attempts,
        )


def _stream_error(exc: Exception, watchdog: Watchdog, events: int) -> Exception:
    if watchdog.fired:
        return StreamDeadline()
    if isinstance(exc, httpx2.TimeoutException | anthropic.APITimeoutError):
        return exc
    if isinstance(exc, httpx2.HTTPError | anthropic.APIConnectionError):
        return StreamInterrupted(
            f"the stream broke after {events} events ({type(exc).__name__})"
        )
    return exc


class _Assembly:
    """A streamed message put together from its raw events."""

    def __init__(self) -> None:
        self.events = 0
        self.started: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.calls = ToolCallBuffer()
        self.stop_reason: str | None = None
        self.usage: dict[str, int] = {}

    def _usage(self, usage: Any) -> None:
        if usage is None:
            return
        for key, value in usage.model_dump().items():
            if isinstance(value, int):  # cumulative counts: the latest wins
                self.usage[key] = max(value, self.usage.get(key, 0))

    def add(self, event: Any) -> str:
        """Take one event; returns its text delta."""
        self.events += 1
        kind = event.type
        if kind == "message_start":
            self.started = event.message.model_dump(mode="json")
            self._usage(event.message.usage)
        elif kind == "content_block_start":
            block = event.content_block
            self.blocks[event.index] = {"type": block.type, "text": ""}
            if block.type == "tool_use":
                self.calls.add(event.index, block.id, block.name, "")
        elif kind == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta":
                slot = self.blocks.setdefault(event.index, {"type": "text", "text": ""})
                slot["text"] += delta.text
                return str(delta.text)
            if delta.type == "input_json_delta":
                self.calls.add(event.index, None, None, delta.partial_json)
        elif kind == "message_delta":
            if event.delta.stop_reason:
                self.stop_reason = str(event.delta.stop_reason)
            self._usage(event.usage)
        return ""

    def message(self, model: str) -> dict[str, Any]:
        """The whole message, as the non-streamed API would have returned it."""
        content: list[dict[str, Any]] = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if block["type"] == "text":
                content.append({"type": "text", "text": block["text"]})
            elif block["type"] == "tool_use":
                call = self.calls.calls[index]
                content.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["name"],
                        "input": _tool_input(call["arguments"]),
                        # Verbatim, so a half-written input is caught as such.
                        "raw_input": call["arguments"],
                    }
                )
        return {
            **self.started,
            "model": self.started.get("model") or model,
            "content": content,
            "stop_reason": self.stop_reason,
            "usage": dict(self.usage),
            "streamed": True,
            "events": self.events,
        }
