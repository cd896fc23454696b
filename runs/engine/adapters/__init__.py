"""Model adapters: the only place the engine talks to a model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from runs.engine.actions import ModelReply


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
    ) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.status_code = status_code
        self.provider_request_id = provider_request_id
        self.attempts = attempts
        self.retryable = retryable

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": self.message,
            "status_code": self.status_code,
            "provider_request_id": self.provider_request_id,
            "attempts": self.attempts,
            "retryable": self.retryable,
        }


class ModelAdapter(Protocol):
    """One call to a model: chat messages in, one reply out; raises `ModelError`."""

    @property
    def provider(self) -> str: ...

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        max_output_tokens: int,
    ) -> ModelReply: ...


ADAPTER_KINDS = ("scripted", "openai")


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
    """The adapter an agent is configured with (`scripted` or `openai`).

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
    raise ValueError(
        f"unknown model adapter {kind!r}; known: {', '.join(ADAPTER_KINDS)}"
    )


__all__ = ["ADAPTER_KINDS", "ModelAdapter", "ModelError", "build_model_adapter"]
