"""Model adapters: the only place the engine talks to a model."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from runs.engine.actions import ModelReply

# How providers say the prompt is longer than the model's window.
_OVERFLOW_KINDS = frozenset({"context_overflow", "context_length_exceeded"})
_OVERFLOW_WORDS = (
    "context_length_exceeded",
    "maximum context length",
    "context window",
    "prompt is too long",
    "too many tokens",
)


class ModelError(Exception):
    """A model call failed for good (after any retries the adapter makes)."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status_code: int | None = None,
        provider_request_id: str | None = None,
        attempts: int = 1,
        retryable: bool = False,
        routing: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.status_code = status_code
        self.provider_request_id = provider_request_id
        self.attempts = attempts
        self.retryable = retryable
        # Which endpoints were tried and the state of their circuits (breaker.py).
        self.routing = dict(routing) if routing else None

    @property
    def is_context_overflow(self) -> bool:
        """Whether the call failed because its input was too long."""
        if self.kind in _OVERFLOW_KINDS:
            return True
        message = self.message.lower()
        return any(words in message for words in _OVERFLOW_WORDS)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind,
            "message": self.message,
            "status_code": self.status_code,
            "provider_request_id": self.provider_request_id,
            "attempts": self.attempts,
            "retryable": self.retryable,
        }
        if self.routing:
            data["routing"] = self.routing
        return data


# Receives each text delta of a streamed reply, for display only (spec §1.4): the
# reply returned at the end is what counts. A sink that also has a
# `discard(reason: str)` method is told when the deltas shown so far are void (a
# dropped stream asked again, a fallback endpoint answering instead).
DeltaSink = Callable[[str], None]


class ModelAdapter(Protocol):
    """One call to a model: chat messages in, one reply out; raises `ModelError`.
    `on_delta`, if given, sees the reply's text as it streams."""

    @property
    def provider(self) -> str: ...

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        max_output_tokens: int,
        *,
        on_delta: DeltaSink | None = None,
    ) -> ModelReply: ...


ADAPTER_KINDS = ("scripted", "openai", "anthropic")


def build_model_adapter(
    kind: str,
    *,
    model: str,
    script: Sequence[Mapping[str, Any]] = (),
    script_position: int = 0,
    api_key: str = "",
    base_url: str | None = None,
    deadline_seconds: float | None = None,
    options: Mapping[str, Any] | None = None,
) -> ModelAdapter:
    """The adapter an endpoint is configured with (`scripted`, `openai`,
    `anthropic`); `options` are the adapter's keyword settings (`stream`,
    `timeout_seconds`, `max_retries`, ...).

    `script_position` is how many replies a resumed run has already consumed.
    `deadline_seconds` bounds one call with all its retries (the scripted model
    answers at once).
    """
    if kind == "scripted":
        from runs.engine.adapters.scripted import ScriptedModel

        return ScriptedModel.with_position(script, script_position, model=model)
    if kind == "openai":
        from runs.engine.adapters.openai_compatible import OpenAIModel

        settings = dict(options or {})
        if deadline_seconds is not None:
            settings["deadline_seconds"] = deadline_seconds
        return OpenAIModel(model=model, api_key=api_key, base_url=base_url, **settings)
    if kind == "anthropic":
        from runs.engine.adapters.anthropic_messages import AnthropicModel

        settings = dict(options or {})
        if deadline_seconds is not None:
            settings["deadline_seconds"] = deadline_seconds
        return AnthropicModel(
            model=model, api_key=api_key, base_url=base_url, **settings
        )
    raise ValueError(
        f"unknown model adapter {kind!r}; known: {', '.join(ADAPTER_KINDS)}"
    )


__all__ = [
    "ADAPTER_KINDS",
    "DeltaSink",
    "ModelAdapter",
    "ModelError",
    "build_model_adapter",
]
