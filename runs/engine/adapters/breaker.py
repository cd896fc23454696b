"""A circuit breaker per endpoint, and the fallback it sends calls to (spec §1.7).

After `failure_threshold` consecutive provider failures (calls that failed after
their own retries) the endpoint's circuit opens for `cooldown_seconds`. While it
is open, calls go straight to the fallback endpoint (an agent lists it among the
models it was evaluated with) or, with no fallback, fail at once with a
`circuit_open` model error. After the cool-down the circuit is half-open: one
call (across every worker) is let through as a trial; its success closes the
circuit, its failure opens it again for another cool-down. Meanwhile the others
keep going to the fallback.

A call that fails on a closed circuit is answered by the fallback too, if there
is one and time is left within the call's deadline; the failure still counts.

Errors that say our request was wrong (`bad_request`) are not the provider's
failure: they neither count nor fall back (the fallback would be sent the same);
the provider answered, so they close the circuit like a success.

The state lives in a `BreakerStore` shared by every worker (the host's is in
Redis; `MemoryBreakerStore` serves one process and the tests). Times are wall
clock seconds, comparable between workers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from runs.engine.actions import ModelReply
from runs.engine.adapters import DeltaSink, ModelAdapter, ModelError
from runs.engine.adapters.retrying import MIN_ATTEMPT_SECONDS, discard_deltas

Admission = Literal["closed", "open", "trial"]

# Our request's fault, our code's or our configuration's (a key secret not set, a
# client the SDK refused to build): the provider is not failing.
NOT_PROVIDER_FAILURES = frozenset(
    {
        "bad_request",
        "adapter_error",
        "script_exhausted",
        "missing_secret",
        "configuration",
    }
)


@dataclass(frozen=True)
class BreakerSettings:
    failure_threshold: int = 3
    cooldown_seconds: float = 30.0
    # How long a half-open trial may take before another worker may try one.
    trial_seconds: float = 120.0

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> BreakerSettings:
        """From an endpoint's options (`breaker_failures`,
        `breaker_cooldown_seconds`, `breaker_trial_seconds`)."""
        options = options or {}
        default = cls()
        return cls(
            failure_threshold=max(
                1, int(options.get("breaker_failures", default.failure_threshold))
            ),
            cooldown_seconds=max(
                0.0,
                float(
                    options.get("breaker_cooldown_seconds", default.cooldown_seconds)
                ),
            ),
            trial_seconds=max(
                1.0, float(options.get("breaker_trial_seconds", default.trial_seconds))
            ),
        )


@dataclass(frozen=True)
class BreakerState:
    failures: int = 0
    open_until: float = 0.0  # 0: closed
    trial_until: float = 0.0  # a half-open trial is under way until then


class BreakerStore(Protocol):
    """Shared breaker state; each method is atomic for its key."""

    def admit(self, key: str, *, now: float, settings: BreakerSettings) -> Admission:
        """closed: call it; open: do not; trial: call it as the half-open trial
        (the store hands out one trial per cool-down)."""
        ...

    def success(self, key: str) -> None:
        """The endpoint answered: the circuit closes, the count restarts."""
        ...

    def failure(
        self, key: str, *, now: float, settings: BreakerSettings, trial: bool
    ) -> bool:
        """Count a provider failure; True if the circuit is open after it."""
        ...

    def state(self, key: str) -> BreakerState: ...


class MemoryBreakerStore:
    """A breaker store for one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, BreakerState] = {}

    def state(self, key: str) -> BreakerState:
        with self._lock:
            return self._states.get(key, BreakerState())

    def admit(self, key: str, *, now: float, settings: BreakerSettings) -> Admission:
        with self._lock:
            state = self._states.get(key, BreakerState())
            if not state.open_until:
                return "closed"
            if now < state.open_until or now < state.trial_until:
                return "open"
            self._states[key] = BreakerState(
                state.failures, state.open_until, now + settings.trial_seconds
            )
            return "trial"

    def success(self, key: str) -> None:
        with self._lock:
            self._states.pop(key, None)

    def failure(
        self, key: str, *, now: float, settings: BreakerSettings, trial: bool
    ) -> bool:
        with self._lock:
            state = self._states.get(key, BreakerState())
            failures = state.failures + 1
            if trial or failures >= settings.failure_threshold:
                self._states[key] = BreakerState(
                    failures, now + settings.cooldown_seconds, 0.0
                )
                return True
            self._states[key] = BreakerState(failures, state.open_until, 0.0)
            return bool(state.open_until)


@dataclass(frozen=True)
class Endpoint:
    """One endpoint+model to call, with its breaker key and a label for the trace."""

    adapter: ModelAdapter
    label: str  # e.g. the endpoint's slug
    model: str
    breaker_key: str


class CircuitBreakerModel:
    """The agent's endpoint behind its circuit breaker, with an optional fallback."""

    def __init__(
        self,
        primary: Endpoint,
        *,
        store: BreakerStore,
        settings: BreakerSettings | None = None,
        fallback: Endpoint | None = None,
        deadline_seconds: float | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.primary = primary
        self.fallback = fallback
        self.store = store
        self.settings = settings or BreakerSettings()
        self.deadline_seconds = deadline_seconds
        self._clock = clock
        self._monotonic = monotonic

    @property
    def provider(self) -> str:
        return self.primary.adapter.provider

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        max_output_tokens: int,
        *,
        on_delta: DeltaSink | None = None,
    ) -> ModelReply:
        started = self._monotonic()
        primary = self.primary
        routing: dict[str, Any] = {"endpoint": primary.label, "model": primary.model}
        admission = self.store.admit(
            primary.breaker_key, now=self._clock(), settings=self.settings
        )
        routing["circuit"] = admission
        if admission == "open":
            return self._fallback(
                messages, tools, max_output_tokens, on_delta, routing, started,
                reason="circuit_open", error=None,
            )  # fmt: skip
        if self.deadline_seconds is not None:
            _cap_deadline(primary.adapter, self.deadline_seconds)
        try:
            reply = primary.adapter.complete(
                messages, tools, max_output_tokens, on_delta=on_delta
            )
        except ModelError as exc:
            if exc.kind in NOT_PROVIDER_FAILURES:
                if exc.status_code is not None:
                    # The provider answered (it refused our request): it is up.
                    self.store.success(primary.breaker_key)
                exc.routing = {**routing, "fallback_used": False}
                raise
            opened = self.store.failure(
                primary.breaker_key,
                now=self._clock(),
                settings=self.settings,
                trial=admission == "trial",
            )
            routing["circuit_opened"] = opened
            discard_deltas(on_delta, "fallback")
            return self._fallback(
                messages, tools, max_output_tokens, on_delta, routing, started,
                reason=exc.kind, error=exc,
            )  # fmt: skip
        self.store.success(primary.breaker_key)
        return _with_routing(reply, {**routing, "fallback_used": False})

    def _fallback(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        max_output_tokens: int,
        on_delta: DeltaSink | None,
        routing: dict[str, Any],
        started: float,
        *,
        reason: str,
        error: ModelError | None,
    ) -> ModelReply:
        if error is not None:
            routing["primary_error"] = {"kind": error.kind, "message": error.message}
        fallback = self.fallback
        if fallback is None:
            raise self._failed(routing, reason, error, "no fallback endpoint is set")
        left = None
        if self.deadline_seconds is not None:
            left = self.deadline_seconds - (self._monotonic() - started)
            if left < MIN_ATTEMPT_SECONDS:
                raise self._failed(
                    routing, reason, error, "no time was left for the fallback"
                )
        routing.update(
            fallback_used=True,
            fallback_reason=reason,
            answered_by={"endpoint": fallback.label, "model": fallback.model},
        )
        adapter = fallback.adapter
        if left is not None:
            # What is left of this call's deadline, never more than its own.
            _cap_deadline(adapter, left)
        try:
            reply = adapter.complete(
                messages, tools, max_output_tokens, on_delta=on_delta
            )
        except ModelError as exc:
            exc.routing = {**routing, "fallback_error": exc.kind}
            raise
        return _with_routing(reply, routing)

    def _failed(
        self,
        routing: dict[str, Any],
        reason: str,
        error: ModelError | None,
        why: str,
    ) -> ModelError:
        routing["fallback_used"] = False
        primary = self.primary
        if error is not None:
            error.routing = routing
            return error
        state = self.store.state(primary.breaker_key)
        until = max(0.0, state.open_until - self._clock())
        return ModelError(
            "circuit_open",
            f"the circuit of endpoint {primary.label!r} (model {primary.model!r}) "
            f"is open after {state.failures} consecutive provider failures; "
            f"{why}; the next trial call is in {until:.0f}s",
            retryable=True,
            attempts=0,
            routing=routing,
        )


def _cap_deadline(adapter: ModelAdapter, seconds: float) -> None:
    """An adapter's call deadline (read at each call) no later than `seconds`."""
    if not hasattr(adapter, "deadline_seconds"):
        return
    current = adapter.deadline_seconds
    adapter.deadline_seconds = seconds if current is None else min(current, seconds)


def _with_routing(reply: ModelReply, routing: dict[str, Any]) -> ModelReply:
    return replace(reply, routing=routing)
