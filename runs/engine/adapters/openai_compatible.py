"""The `openai` adapter: Chat Completions through the official SDK, any base_url
(OpenAI, vLLM, Ollama, LM Studio, a LiteLLM proxy).

Retries, the call deadline and the streaming rules are `retrying.RetryingAdapter`'s.
Quota (429 `insufficient_quota`) and auth (401/403) errors are not retried.

With `stream=True` the request asks for `stream_options.include_usage`, so the
last chunk carries the provider's usage; a stream that finished (a finish reason
came) but whose usage chunk never did keeps zero usage, and the host then
charges the call's reservation (`billable_usage`: the estimated input and the
whole output reservation), never less than it could have cost. A server that
rejects `stream_options` (some older OpenAI-compatible servers) can be served
with `stream_usage=False`; one that ignores `stream` and answers with a JSON
completion is read as such.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx2
import openai
from openai.types.chat import ChatCompletion

from runs.engine.actions import ModelReply, ToolCall, Usage
from runs.engine.adapters import DeltaSink, ModelError
from runs.engine.adapters.retrying import (
    DEFAULT_BASE_DELAY_SECONDS,
    DEFAULT_DEADLINE_SECONDS,
    DEFAULT_MAX_DELAY_SECONDS,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT_SECONDS,
    MIN_ATTEMPT_SECONDS,
    Failure,
    RetryingAdapter,
    StreamDeadline,
    StreamInterrupted,
    ToolCallBuffer,
    Watchdog,
    retry_after_seconds,
)

__all__ = [
    "DEFAULT_BASE_DELAY_SECONDS",
    "DEFAULT_DEADLINE_SECONDS",
    "DEFAULT_MAX_DELAY_SECONDS",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_TIMEOUT_SECONDS",
    "MIN_ATTEMPT_SECONDS",
    "OpenAIModel",
    "classify_error",
    "retry_after_seconds",
]

QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached"})


def _error_code(exc: openai.APIError) -> str:
    code = getattr(exc, "code", None)
    kind = getattr(exc, "type", None)
    body: dict[str, Any] = exc.body if isinstance(exc.body, dict) else {}
    inner = body.get("error")
    nested: dict[str, Any] = inner if isinstance(inner, dict) else body
    values = [code, kind, nested.get("code"), nested.get("type")]
    return next((str(v) for v in values if v), "")


def _request_id(exc: openai.APIStatusError) -> str | None:
    return exc.response.headers.get("x-request-id") or exc.request_id


def classify_error(exc: Exception) -> tuple[str, bool]:
    """(kind, transient) for an SDK exception."""
    if isinstance(exc, openai.APITimeoutError | httpx2.TimeoutException):
        return "timeout", True
    if isinstance(exc, openai.APIConnectionError):
        return "connection", True
    if isinstance(exc, httpx2.TransportError):  # broke while a stream was read
        return "stream_interrupted", True
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status == 429:
            if _error_code(exc) in QUOTA_CODES:
                return "quota_exhausted", False
            return "rate_limited", True
        if status in (401, 403):
            return "auth", False
        if status == 408 or status >= 500:
            return "server", True
        return "bad_request", False
    if isinstance(exc, openai.APIResponseValidationError):
        return "bad_response", False
    if isinstance(exc, openai.APIError):  # an error event inside a stream
        code = _error_code(exc)
        if code in QUOTA_CODES:
            return "quota_exhausted", False
        return "server", True
    return "unexpected", False


def _safe_message(exc: Exception) -> str:
    """The provider's message without our request (no keys, no payloads)."""
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        nested = body.get("error") if isinstance(body.get("error"), dict) else body
        message = nested.get("message") if isinstance(nested, dict) else None
        return f"HTTP {exc.status_code}: {message or 'error'}"[:500]
    if isinstance(exc, openai.APIError) and not isinstance(
        exc, openai.APIConnectionError
    ):
        return f"error in the stream: {exc.message}"[:500]
    return f"{type(exc).__name__}"


class OpenAIModel(RetryingAdapter):
    """A model behind any OpenAI-compatible Chat Completions endpoint."""

    provider_name = "openai"

    def __init__(
        self,
        *,
        model: str,
        api_key: str,
        base_url: str | None = None,
        max_tokens_param: str = "max_completion_tokens",
        parallel_tool_calls: bool | None = False,
        stream_usage: bool = True,
        client: openai.OpenAI | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(model=model, **settings)
        self.max_tokens_param = max_tokens_param
        self.parallel_tool_calls = parallel_tool_calls
        self.stream_usage = stream_usage
        self.own_secret = api_key
        # max_retries=0: the SDK must not retry underneath the agent-level policy.
        self._client = client or openai.OpenAI(
            api_key=api_key,
            base_url=base_url,
            timeout=self.timeout_seconds,
            max_retries=0,
        )

    def _request(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        max_output_tokens: int,
    ) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in messages],
            self.max_tokens_param: max_output_tokens,
        }
        if tools:
            request["tools"] = [dict(t) for t in tools]
            request["tool_choice"] = "auto"
            if self.parallel_tool_calls is not None:
                request["parallel_tool_calls"] = self.parallel_tool_calls
        if self.stream:
            request["stream"] = True
            if self.stream_usage:
                request["stream_options"] = {"include_usage": True}
        return request

    def _classify(self, exc: Exception) -> Failure | None:
        if not isinstance(exc, openai.OpenAIError | httpx2.HTTPError):
            return None
        kind, transient = classify_error(exc)
        status = None
        request_id = None
        retry_after = None
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            request_id = _request_id(exc)
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
        raw = self._client.chat.completions.with_raw_response.create(
            **request, timeout=timeout
        )
        request_id = raw.headers.get("x-request-id")
        if not self.stream:
            completion = raw.parse()
            return self._reply(completion, request_id, attempts)
        if "text/event-stream" not in raw.headers.get("content-type", ""):
            # A server that ignores `stream` answers with the whole completion.
            guard = Watchdog(deadline - self._clock(), raw.http_response.close)
            with guard.running():
                try:
                    raw.http_response.read()
                except Exception as exc:
                    raise _stream_error(exc, guard, 0) from None
            completion = ChatCompletion.model_validate(raw.http_response.json())
            return self._reply(completion, request_id, attempts)
        stream = raw.parse()
        watchdog = Watchdog(deadline - self._clock(), stream.close)
        assembled = _Assembly()
        try:
            with watchdog.running():
                for chunk in stream:
                    text = assembled.add(chunk)
                    if text and on_delta is not None:
                        on_delta(text)
                    if self._clock() >= deadline:
                        raise StreamDeadline()
        except Exception as exc:
            raise _stream_error(exc, watchdog, assembled.chunks) from None
        finally:
            stream.close()
        if watchdog.fired:
            raise StreamDeadline()
        if assembled.finish_reason is None:
            raise StreamInterrupted(
                f"the stream ended after {assembled.chunks} chunks without a "
                "finish reason"
            )
        return assembled.reply(self, request_id, attempts)

    def _reply(
        self, completion: Any, request_id: str | None, attempts: int
    ) -> ModelReply:
        if not getattr(completion, "choices", None):
            raise ModelError(
                "bad_response",
                "the response has no choices",
                provider_request_id=request_id,
                attempts=attempts,
            )
        choice = completion.choices[0]
        message = choice.message
        calls = tuple(
            ToolCall.parse(
                str(call.id), str(call.function.name), call.function.arguments or ""
            )
            for call in (message.tool_calls or [])
            if getattr(call, "function", None) is not None
        )
        usage = completion.usage
        return ModelReply(
            tool_calls=calls,
            text=message.content,
            finish_reason=str(choice.finish_reason or "stop"),
            usage=Usage(
                input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            ),
            model=str(completion.model or self.model),
            provider=self.provider,
            provider_request_id=request_id or completion.id,
            response_id=completion.id,
            raw=completion.model_dump(mode="json"),
            attempts=attempts,
        )


def _stream_error(exc: Exception, watchdog: Watchdog, chunks: int) -> Exception:
    """What a failure while reading a stream means: the deadline's watchdog
    closed it, a read timed out, or the connection broke mid-way."""
    if watchdog.fired:
        return StreamDeadline()
    if isinstance(exc, httpx2.TimeoutException | openai.APITimeoutError):
        return exc
    if isinstance(exc, httpx2.HTTPError | openai.APIConnectionError):
        return StreamInterrupted(
            f"the stream broke after {chunks} chunks ({type(exc).__name__})"
        )
    return exc


class _Assembly:
    """A streamed completion put together chunk by chunk (choice 0)."""

    def __init__(self) -> None:
        self.chunks = 0
        self.text: list[str] = []
        self.calls = ToolCallBuffer()
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.response_id: str | None = None
        self.model: str | None = None

    def add(self, chunk: Any) -> str:
        """Take one chunk; returns its text delta."""
        self.chunks += 1
        self.response_id = self.response_id or getattr(chunk, "id", None)
        self.model = self.model or getattr(chunk, "model", None)
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        text = ""
        for choice in getattr(chunk, "choices", None) or []:
            if getattr(choice, "index", 0) != 0:
                continue
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    text += delta.content
                for position, call in enumerate(delta.tool_calls or []):
                    index = call.index if call.index is not None else position
                    function = call.function
                    self.calls.add(
                        index,
                        call.id,
                        function.name if function else None,
                        (function.arguments or "") if function else "",
                    )
            if choice.finish_reason:
                self.finish_reason = str(choice.finish_reason)
        if text:
            self.text.append(text)
        return text

    def reply(
        self, model: OpenAIModel, request_id: str | None, attempts: int
    ) -> ModelReply:
        calls = self.calls.ordered()
        text = "".join(self.text) or None
        usage = Usage(
            input_tokens=int(getattr(self.usage, "prompt_tokens", 0) or 0),
            output_tokens=int(getattr(self.usage, "completion_tokens", 0) or 0),
        )
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for call in calls
            ]
        # The stream recorded as the completion it adds up to.
        raw = {
            "id": self.response_id,
            "object": "chat.completion",
            "model": self.model or model.model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": self.finish_reason}
            ],
            "usage": None if self.usage is None else self.usage.model_dump(mode="json"),
            "streamed": True,
            "chunks": self.chunks,
        }
        return ModelReply(
            tool_calls=tuple(
                ToolCall.parse(call["id"], call["name"], call["arguments"])
                for call in calls
            ),
            text=text,
            finish_reason=self.finish_reason or "stop",
            usage=usage,
            model=str(self.model or model.model),
            provider=model.provider,
            provider_request_id=request_id or self.response_id,
            response_id=self.response_id,
            raw=raw,
            attempts=attempts,
        )
