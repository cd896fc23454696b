"""A run's model client as the host builds it: streaming by default, the
endpoint's breaker in Redis, the fallback endpoint with a circuit of its own."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from runs.breaker import breaker_key, breaker_store
from runs.devserver import ChatCompletionsServer, MessagesServer
from runs.engine.adapters import ModelError
from runs.engine.adapters.anthropic_messages import AnthropicModel
from runs.engine.adapters.breaker import CircuitBreakerModel
from runs.engine.adapters.openai_compatible import OpenAIModel
from runs.engine.adapters.scripted import ScriptedModel
from runs.model_routing import PRIMARY_SHARE, endpoint_adapter, routed_model

MESSAGES = [{"role": "user", "content": "Where is order 4821?"}]


def row(kind: str, base_url: str = "", **options: Any) -> Any:
    return SimpleNamespace(
        pk=uuid.uuid4(),
        slug=f"{kind}-ep",
        kind=kind,
        base_url=base_url,
        options=options,
    )


def test_provider_endpoints_stream_unless_told_not_to() -> None:
    streamed = endpoint_adapter(
        row("anthropic", "http://127.0.0.1:9"),
        model="m",
        api_key="k",
        deadline_seconds=9,
    )
    assert isinstance(streamed, AnthropicModel) and streamed.stream is True
    plain = endpoint_adapter(
        row("openai", "http://127.0.0.1:9/v1", stream=False, max_retries=1,
            breaker_failures=5),
        model="m", api_key="k", deadline_seconds=9,
    )  # fmt: skip
    assert isinstance(plain, OpenAIModel)
    assert plain.stream is False and plain.max_retries == 1
    assert plain.deadline_seconds == 9
    scripted = endpoint_adapter(
        row("scripted"),
        model="s",
        api_key="",
        deadline_seconds=9,
        script=[{"text": "x"}],
    )
    assert isinstance(scripted, ScriptedModel)
    assert (
        routed_model(
            scripted,
            endpoint=row("scripted"),
            model="s",
            tenant_id=1,
            deadline_seconds=9,
        )
        is scripted
    )


def test_the_fallback_answers_and_the_shared_circuit_opens() -> None:
    tenant_id = "t-" + uuid.uuid4().hex[:8]
    with ChatCompletionsServer() as primary_server, MessagesServer() as fallback_server:
        primary_row = row("openai", primary_server.base_url, breaker_failures=2,
                          max_retries=0)  # fmt: skip
        fallback_row = row("anthropic", fallback_server.base_url, max_retries=0)

        def client() -> Any:
            primary = endpoint_adapter(
                primary_row, model="gpt-main", api_key="k", deadline_seconds=20
            )
            backup = endpoint_adapter(
                fallback_row, model="claude-backup", api_key="k", deadline_seconds=20
            )
            return routed_model(
                primary, endpoint=primary_row, model="gpt-main", tenant_id=tenant_id,
                deadline_seconds=20, fallback=(backup, fallback_row, "claude-backup"),
            )  # fmt: skip

        try:
            for _ in range(2):
                primary_server.error(503, "down")
                fallback_server.reply("from the backup")
                model = client()
                assert isinstance(model, CircuitBreakerModel)
                reply = model.complete(MESSAGES, [], 64, on_delta=lambda text: None)
                assert reply.text == "from the backup" and reply.provider == "anthropic"
                # With a fallback the primary gets a share of the deadline.
                assert model.primary.adapter.deadline_seconds == 20 * PRIMARY_SHARE  # type: ignore[attr-defined]
            assert reply.routing and reply.routing["circuit_opened"] is True
            # Another worker's client sees the open circuit: straight to the backup.
            fallback_server.reply("while open")
            reply = client().complete(MESSAGES, [], 64)
            assert reply.text == "while open"
            assert reply.routing and reply.routing["circuit"] == "open"
            assert len(primary_server.requests) == 2
            # Both down: the backup's own failure is the error, with the route.
            fallback_server.error(529, "Overloaded")
            with pytest.raises(ModelError) as caught:
                client().complete(MESSAGES, [], 64)
            assert caught.value.kind == "overloaded"
            assert caught.value.routing
            assert caught.value.routing["fallback_error"] == "overloaded"
        finally:
            for ep, name in (
                (primary_row, "gpt-main"),
                (fallback_row, "claude-backup"),
            ):
                breaker_store().success(
                    breaker_key(tenant_id=tenant_id, endpoint_id=ep.pk, model=name)
                )
