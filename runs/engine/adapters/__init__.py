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


__all__ = ["ModelAdapter", "ModelError"]
