"""The `openai` adapter: Chat Completions through the official SDK, any base_url.

HTTP-level retries are off (`max_retries=0`): this layer understands the errors and
retries only transient ones (429 rate limits, 5xx, timeouts, connection errors), at
most `max_retries` times, with exponential backoff and jitter, honouring
`Retry-After`. Quota (429 `insufficient_quota`) and auth (401/403) errors are not
retried: they surface to the operator.

One call, all its attempts and backoffs included, ends within `deadline_seconds`:
each attempt's timeout is cut to what is left, and a backoff that would reach the
deadline is not slept. The host keeps this below the run's lease and the task's
hard time limit, so a slow provider never outlives the step that asked it.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import openai

from runs.engine.actions import ModelReply, ToolCall, Usage
from runs.engine.adapters import ModelError

DEFAULT_MAX_RETRIES = 3
DEFAULT_BASE_DELAY_SECONDS = 2.0
DEFAULT_MAX_DELAY_SECONDS = 60.0
DEFAULT_TIMEOUT_SECONDS = 60.0
DEFAULT_DEADLINE_SECONDS = 100.0
# An attempt with less time than this left before the deadline is not started.
MIN_ATTEMPT_SECONDS = 1.0
QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached"})


def retry_after_seconds(headers: Mapping[str, str] | None, now: float) -> float | None:
    """Seconds the server asked us to wait (`retry-after-ms` or `Retry-After`)."""
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def _error_code(exc: openai.APIStatusError) -> str:
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
    if isinstance(exc, openai.APITimeoutError):
        return "timeout", True
    if isinstance(exc, openai.APIConnectionError):
        return "connection", True
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
    return "unexpected", False


class OpenAIModel:
    """A model behind any OpenAI-compatible Chat Completions endpoint."""

    def __init__(
        self,
        *,
        model: str,
        api_key: str,
        base_url: str | None = None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
        max_retries: int = DEFAULT_MAX_RETRIES,
        base_delay_seconds: float = DEFAULT_BASE_DELAY_SECONDS,
        max_delay_seconds: float = DEFAULT_MAX_DELAY_SECONDS,
        max_tokens_param: str = "max_completion_tokens",
        parallel_tool_calls: bool | None = False,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        client: openai.OpenAI | None = None,
    ) -> None:
        self.model = model
        self.timeout_seconds = timeout_seconds
        self.deadline_seconds = deadline_seconds
        self.max_retries = max_retries
        self.base_delay_seconds = base_delay_seconds
        self.max_delay_seconds = max_delay_seconds
        self.max_tokens_param = max_tokens_param
        self.parallel_tool_calls = parallel_tool_calls
        self._sleep = sleep
        self._clock = clock
        self._rng = rng or random.Random()
        # max_retries=0: the SDK must not retry underneath the agent-level policy.
        self._client = client or openai.OpenAI(
            api_key=api_key, base_url=base_url, timeout=timeout_seconds, max_retries=0
        )
        self.delays: list[float] = []  # every backoff slept, for the trace and tests

    @property
    def provider(self) -> str:
        return "openai"

    def backoff_seconds(self, attempt: int, retry_after: float | None) -> float:
        """Delay before retry number `attempt` (0-based): full-range jitter on an
        exponential base, never shorter than the server's `Retry-After`."""
        base = min(self.max_delay_seconds, self.base_delay_seconds * (2.0**attempt))
        delay = base * (0.5 + self._rng.random() / 2)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay

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
        return request

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        max_output_tokens: int,
    ) -> ModelReply:
        request = self._request(messages, tools, max_output_tokens)
        deadline = self._clock() + self.deadline_seconds
        attempt = 0
        anomaly_retried = False
        while True:
            timeout = min(self.timeout_seconds, deadline - self._clock())
            try:
                raw = self._client.chat.completions.with_raw_response.create(
                    **request, timeout=max(timeout, 0.001)
                )
                completion = raw.parse()
                request_id = raw.headers.get("x-request-id")
                reply = self._reply(completion, request_id, attempt + 1)
                if _is_empty_tool_turn(reply) and not anomaly_retried:
                    # finish_reason=tool_calls with no calls: a provider anomaly,
                    # asked again once (spec §2.3), if there is time for it.
                    anomaly_retried = True
                    if deadline - self._clock() >= MIN_ATTEMPT_SECONDS:
                        attempt += 1
                        continue
                return reply
            except openai.OpenAIError as exc:
                kind, transient = classify_error(exc)
                status = getattr(exc, "status_code", None)
                request_id = (
                    _request_id(exc) if isinstance(exc, openai.APIStatusError) else None
                )
                retry_after = None
                if isinstance(exc, openai.APIStatusError):
                    retry_after = retry_after_seconds(exc.response.headers, time.time())
                too_long = retry_after is not None and (
                    retry_after > self.max_delay_seconds
                )
                retry = transient and attempt < self.max_retries and not too_long
                delay = self.backoff_seconds(attempt, retry_after) if retry else 0.0
                # The next attempt would start too close to the deadline (or after it).
                out_of_time = deadline - self._clock() - delay < MIN_ATTEMPT_SECONDS
                if not retry or out_of_time:
                    message = _safe_message(exc)
                    if retry:
                        message += (
                            " (no time left for a retry within the call's "
                            f"deadline of {self.deadline_seconds:g}s)"
                        )
                    raise ModelError(
                        kind,
                        message,
                        status_code=status,
                        provider_request_id=request_id,
                        attempts=attempt + 1,
                        retryable=transient,
                    ) from None
                self.delays.append(delay)
                self._sleep(delay)
                attempt += 1

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


def _is_empty_tool_turn(reply: ModelReply) -> bool:
    return (
        reply.finish_reason == "tool_calls"
        and not reply.tool_calls
        and not (reply.text or "").strip()
    )


def _safe_message(exc: Exception) -> str:
    """The provider's message without our request (no keys, no payloads)."""
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        nested = body.get("error") if isinstance(body.get("error"), dict) else body
        message = nested.get("message") if isinstance(nested, dict) else None
        return f"HTTP {exc.status_code}: {message or 'error'}"[:500]
    return f"{type(exc).__name__}"
