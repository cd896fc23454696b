"""The retry, deadline and streaming rules every provider adapter shares.

HTTP-level retries are off in the SDKs (`max_retries=0`): this layer understands
the errors and retries only transient ones (rate limits, overload, 5xx, timeouts,
connection errors, a stream that dropped), at most `max_retries` times, with
exponential backoff and jitter, honouring `Retry-After`. Quota and auth errors are
not retried: they surface to the operator.

One call, all its attempts and backoffs included, ends within `deadline_seconds`:
each attempt's timeout is cut to what is left, a backoff that would reach the
deadline is not slept, and a stream still going at the deadline is closed (a
watchdog closes its response, so a server that trickles bytes forever cannot
hold the step). The host keeps the deadline below the run's lease and the task's
hard time limit.

Streaming: text deltas go to the caller's `on_delta` as they arrive (display
only, spec §1.4); the reply is built from the whole stream once it finished with
a finish reason. A stream that ends without one (a dropped connection, a proxy
that cut it) is a transient `stream_interrupted` error: the partial answer is
discarded and asked for again, never treated as final (spec §1.7). A sink that
also has a `discard(reason)` method is told when the deltas it was shown are
void.
"""

from __future__ import annotations

import contextlib
import email.utils
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from runs.engine.actions import ModelReply
from runs.engine.adapters import DeltaSink, ModelError

DEFAULT_MAX_RETRIES = 3
DEFAULT_BASE_DELAY_SECONDS = 2.0
DEFAULT_MAX_DELAY_SECONDS = 60.0
DEFAULT_TIMEOUT_SECONDS = 60.0
DEFAULT_DEADLINE_SECONDS = 100.0
# An attempt with less time than this left before the deadline is not started.
MIN_ATTEMPT_SECONDS = 1.0


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


@dataclass(frozen=True)
class Failure:
    """One failed attempt, classified by the adapter."""

    kind: str
    transient: bool
    message: str
    status_code: int | None = None
    request_id: str | None = None
    retry_after: float | None = None


# A quoted run of the key this long is hidden (a gateway may echo a part of it).
SECRET_RUN_CHARS = 8
SECRET_HIDDEN = "[REDACTED]"


def without_secret(text: str, secret: str) -> str:
    """`text` with every run of at least SECRET_RUN_CHARS characters of `secret`
    replaced: a provider's error message may quote the key it was sent (whole or
    in part), and that message becomes the run's stop detail and the chat span's
    status."""
    if len(secret) < SECRET_RUN_CHARS or len(text) < SECRET_RUN_CHARS:
        return text
    n = SECRET_RUN_CHARS
    pieces = {secret[i : i + n] for i in range(len(secret) - n + 1)}
    hidden = [False] * len(text)
    for start in range(len(text) - n + 1):
        if text[start : start + n] in pieces:
            hidden[start : start + n] = [True] * n
    out: list[str] = []
    for index, char in enumerate(text):
        if not hidden[index]:
            out.append(char)
        elif index == 0 or not hidden[index - 1]:
            out.append(SECRET_HIDDEN)
    return "".join(out)


class StreamInterrupted(Exception):
    """The stream ended (or broke) before the provider said it was finished."""


class StreamDeadline(Exception):
    """The stream was still going when the call's deadline came."""


def discard_deltas(on_delta: DeltaSink | None, reason: str) -> None:
    """Tell a sink that what it was shown so far is void (if it wants to know)."""
    discard = getattr(on_delta, "discard", None)
    if callable(discard):
        discard(reason)


class Watchdog:
    """Calls `close` once `seconds` have passed, unless stopped first."""

    def __init__(self, seconds: float, close: Callable[[], object]) -> None:
        self.fired = False
        self._close = close
        self._timer = threading.Timer(max(seconds, 0.0), self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        self.fired = True
        # The reader sees the closed stream; a close that fails changes nothing.
        with contextlib.suppress(Exception):
            self._close()

    @contextmanager
    def running(self) -> Iterator[Watchdog]:
        self._timer.start()
        try:
            yield self
        finally:
            self._timer.cancel()


class RetryingAdapter:
    """The retry loop around one provider's `_attempt`; subclasses classify errors."""

    provider_name = ""

    def __init__(
        self,
        *,
        model: str,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
        max_retries: int = DEFAULT_MAX_RETRIES,
        base_delay_seconds: float = DEFAULT_BASE_DELAY_SECONDS,
        max_delay_seconds: float = DEFAULT_MAX_DELAY_SECONDS,
        stream: bool = False,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.model = model
        self.timeout_seconds = float(timeout_seconds)
        # Read at each call: a fallback gets what is left of the caller's deadline.
        self.deadline_seconds = float(deadline_seconds)
        self.max_retries = int(max_retries)
        self.base_delay_seconds = float(base_delay_seconds)
        self.max_delay_seconds = float(max_delay_seconds)
        self.stream = bool(stream)
        self._sleep = sleep
        self._clock = clock
        self._rng = rng or random.Random()
        self.delays: list[float] = []  # every backoff slept, for the trace and tests
        # The key this client sends: never repeated in an error it raises.
        self.own_secret = ""

    @property
    def provider(self) -> str:
        return self.provider_name

    def backoff_seconds(self, attempt: int, retry_after: float | None) -> float:
        """Delay before retry number `attempt` (0-based): full-range jitter on an
        exponential base, never shorter than the server's `Retry-After`."""
        base = min(self.max_delay_seconds, self.base_delay_seconds * (2.0**attempt))
        delay = base * (0.5 + self._rng.random() / 2)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay

    # -- what a provider adapter implements ------------------------------------

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
        raise NotImplementedError

    def _classify(self, exc: Exception) -> Failure | None:
        """The failure an SDK exception stands for; None: not the provider's."""
        raise NotImplementedError

    def _needs_another_ask(self, reply: ModelReply) -> bool:
        """finish_reason=tool_calls with no calls: a provider anomaly, asked again
        once (spec §2.3)."""
        return (
            reply.finish_reason == "tool_calls"
            and not reply.tool_calls
            and not (reply.text or "").strip()
        )

    # -- the loop ---------------------------------------------------------------

    def _stream_failure(self, exc: Exception) -> Failure | None:
        if isinstance(exc, StreamDeadline):
            return Failure(
                "timeout",
                True,
                "the stream was still going at the call's deadline of "
                f"{self.deadline_seconds:g}s",
            )
        if isinstance(exc, StreamInterrupted):
            return Failure("stream_interrupted", True, str(exc))
        return None

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        max_output_tokens: int,
        *,
        on_delta: DeltaSink | None = None,
    ) -> ModelReply:
        deadline = self._clock() + self.deadline_seconds
        attempt = 0
        anomaly_retried = False
        while True:
            timeout = min(self.timeout_seconds, deadline - self._clock())
            try:
                reply = self._attempt(
                    messages,
                    tools,
                    max_output_tokens,
                    timeout=max(timeout, 0.001),
                    deadline=deadline,
                    attempts=attempt + 1,
                    on_delta=on_delta if self.stream else None,
                )
                if self._needs_another_ask(reply) and not anomaly_retried:
                    anomaly_retried = True
                    if deadline - self._clock() >= MIN_ATTEMPT_SECONDS:
                        attempt += 1
                        continue
                return reply
            except ModelError:
                raise
            except Exception as exc:
                failure = self._stream_failure(exc) or self._classify(exc)
                if failure is None:
                    raise
                if self.stream:
                    discard_deltas(on_delta, failure.kind)
                too_long = failure.retry_after is not None and (
                    failure.retry_after > self.max_delay_seconds
                )
                retry = failure.transient and attempt < self.max_retries
                retry = retry and not too_long
                delay = (
                    self.backoff_seconds(attempt, failure.retry_after) if retry else 0.0
                )
                # The next attempt would start too close to the deadline (or after).
                out_of_time = deadline - self._clock() - delay < MIN_ATTEMPT_SECONDS
                if not retry or out_of_time:
                    message = without_secret(failure.message, self.own_secret)
                    if retry and "deadline" not in message:
                        message += (
                            " (no time left for a retry within the call's "
                            f"deadline of {self.deadline_seconds:g}s)"
                        )
                    raise ModelError(
                        failure.kind,
                        message,
                        status_code=failure.status_code,
                        provider_request_id=failure.request_id,
                        attempts=attempt + 1,
                        retryable=failure.transient,
                    ) from None
                self.delays.append(delay)
                self._sleep(delay)
                attempt += 1


class ToolCallBuffer:
    """Tool-call fragments of a stream, by index (spec §2.3.1): id and name come
    once, arguments are appended as they come and parsed only at the end."""

    def __init__(self) -> None:
        self.calls: dict[int, dict[str, str]] = {}

    def add(self, index: int, call_id: str | None, name: str | None, args: str) -> None:
        slot = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        if call_id and not slot["id"]:
            slot["id"] = call_id
        if name and not slot["name"]:
            slot["name"] = name
        slot["arguments"] += args

    def ordered(self) -> list[dict[str, str]]:
        return [self.calls[index] for index in sorted(self.calls)]
