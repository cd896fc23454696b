"""Circuit breaker and fallback (spec §1.7) with real adapters and local servers:
an OpenAI-compatible primary, an Anthropic fallback."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from runs.devserver import Behaviour, ChatCompletionsServer, MessagesServer, Reply
from runs.engine.adapters import ModelError
from runs.engine.adapters.anthropic_messages import AnthropicModel
from runs.engine.adapters.breaker import (
    BreakerSettings,
    CircuitBreakerModel,
    Endpoint,
    MemoryBreakerStore,
)
from runs.engine.adapters.openai_compatible import OpenAIModel

MESSAGES = [{"role": "user", "content": "Where is order 4821?"}]


@pytest.fixture
def primary_server() -> Iterator[ChatCompletionsServer]:
    with ChatCompletionsServer() as running:
        assert isinstance(running, ChatCompletionsServer)
        yield running


@pytest.fixture
def fallback_server() -> Iterator[MessagesServer]:
    with MessagesServer() as running:
        assert isinstance(running, MessagesServer)
        yield running


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def primary(server: ChatCompletionsServer) -> Endpoint:
    adapter = OpenAIModel(
        model="gpt-main", api_key="k", base_url=server.base_url, stream=True,
        max_retries=0, sleep=lambda s: None, rng=random.Random(1),
    )  # fmt: skip
    return Endpoint(adapter, "main", "gpt-main", "tenant-1:main:gpt-main")


def fallback(server: MessagesServer) -> Endpoint:
    adapter = AnthropicModel(
        model="claude-backup", api_key="k", base_url=server.base_url, stream=True,
        max_retries=0, sleep=lambda s: None,
    )  # fmt: skip
    return Endpoint(adapter, "backup", "claude-backup", "tenant-1:backup:claude-backup")


def breaker(
    primary_server: ChatCompletionsServer,
    fallback_server: MessagesServer | None,
    store: MemoryBreakerStore,
    clock: Clock,
    **kw: Any,
) -> CircuitBreakerModel:
    return CircuitBreakerModel(
        primary(primary_server),
        store=store,
        settings=BreakerSettings(failure_threshold=3, cooldown_seconds=30),
        fallback=fallback(fallback_server) if fallback_server else None,
        clock=clock,
        **kw,
    )


def test_without_a_fallback_the_circuit_opens_after_three_failures_and_fails_fast(
    primary_server: ChatCompletionsServer,
) -> None:
    store, clock = MemoryBreakerStore(), Clock()
    for _ in range(3):
        primary_server.error(503, "down")
    for _ in range(3):
        with pytest.raises(ModelError) as caught:
            breaker(primary_server, None, store, clock).complete(MESSAGES, [], 64)
        assert caught.value.kind == "server"
    assert len(primary_server.requests) == 3
    with pytest.raises(ModelError) as caught:
        breaker(primary_server, None, store, clock).complete(MESSAGES, [], 64)
    error = caught.value
    assert error.kind == "circuit_open"
    assert "'main'" in error.message and "no fallback" in error.message
    assert error.routing is not None and error.routing["circuit"] == "open"
    # Failed fast: the provider was not asked again.
    assert len(primary_server.requests) == 3


def test_the_fallback_answers_a_failed_call_and_every_call_while_open(
    primary_server: ChatCompletionsServer, fallback_server: MessagesServer
) -> None:
    store, clock = MemoryBreakerStore(), Clock()
    for _ in range(3):
        primary_server.error(500, "boom")
    for n in range(3):
        fallback_server.reply(f"backup answer {n}")
    replies = [
        breaker(primary_server, fallback_server, store, clock).complete(
            MESSAGES, [], 64
        )
        for _ in range(3)
    ]
    assert [r.text for r in replies] == [f"backup answer {n}" for n in range(3)]
    assert all(
        r.provider == "anthropic" and r.model == "claude-backup" for r in replies
    )
    first = replies[0].routing
    assert first is not None
    assert first["fallback_used"] is True and first["fallback_reason"] == "server"
    assert first["circuit"] == "closed" and first["circuit_opened"] is False
    assert first["answered_by"] == {"endpoint": "backup", "model": "claude-backup"}
    assert replies[2].routing and replies[2].routing["circuit_opened"] is True
    # Open: straight to the fallback, the primary is not asked.
    fallback_server.reply("while open")
    reply = breaker(primary_server, fallback_server, store, clock).complete(
        MESSAGES, [], 64
    )
    assert reply.text == "while open"
    assert reply.routing and reply.routing["circuit"] == "open"
    assert reply.routing["fallback_reason"] == "circuit_open"
    assert len(primary_server.requests) == 3


def test_half_open_lets_one_trial_through_and_its_success_closes_the_circuit(
    primary_server: ChatCompletionsServer, fallback_server: MessagesServer
) -> None:
    store, clock = MemoryBreakerStore(), Clock()
    for _ in range(3):
        primary_server.error(502, "bad gateway")
        fallback_server.reply("backup")
        breaker(primary_server, fallback_server, store, clock).complete(
            MESSAGES, [], 64
        )
    clock.now += 31
    # Two workers after the cool-down: one trial, the other still goes to the fallback.
    assert (
        store.admit("tenant-1:main:gpt-main", now=clock.now, settings=BreakerSettings())
        == "trial"
    )
    fallback_server.reply("backup during the trial")
    other = breaker(primary_server, fallback_server, store, clock).complete(
        MESSAGES, [], 64
    )
    assert other.text == "backup during the trial"
    store.success("tenant-1:main:gpt-main")  # the first worker's trial answered
    primary_server.reply("main is back")
    reply = breaker(primary_server, fallback_server, store, clock).complete(
        MESSAGES, [], 64
    )
    assert reply.text == "main is back" and reply.provider == "openai"
    assert reply.routing and reply.routing["circuit"] == "closed"
    assert reply.routing["fallback_used"] is False


def test_a_failed_trial_opens_the_circuit_for_another_cool_down(
    primary_server: ChatCompletionsServer, fallback_server: MessagesServer
) -> None:
    store, clock = MemoryBreakerStore(), Clock()
    for _ in range(3):
        primary_server.error(500, "boom")
        fallback_server.reply("backup")
        breaker(primary_server, fallback_server, store, clock).complete(
            MESSAGES, [], 64
        )
    clock.now += 31
    primary_server.error(500, "still down")
    fallback_server.reply("backup after a failed trial")
    reply = breaker(primary_server, fallback_server, store, clock).complete(
        MESSAGES, [], 64
    )
    assert reply.routing and reply.routing["circuit"] == "trial"
    assert reply.routing["circuit_opened"] is True
    assert len(primary_server.requests) == 4
    clock.now += 29
    fallback_server.reply("still open")
    breaker(primary_server, fallback_server, store, clock).complete(MESSAGES, [], 64)
    assert len(primary_server.requests) == 4


def test_a_bad_request_neither_counts_nor_falls_back(
    primary_server: ChatCompletionsServer, fallback_server: MessagesServer
) -> None:
    store, clock = MemoryBreakerStore(), Clock()
    for _ in range(4):
        primary_server.error(400, "context too long")
    for _ in range(4):
        with pytest.raises(ModelError) as caught:
            breaker(primary_server, fallback_server, store, clock).complete(
                MESSAGES, [], 64
            )
        assert caught.value.kind == "bad_request"
    assert fallback_server.requests == []
    assert store.state("tenant-1:main:gpt-main").failures == 0


def test_a_trial_answered_with_a_bad_request_closes_the_circuit(
    primary_server: ChatCompletionsServer, fallback_server: MessagesServer
) -> None:
    store, clock = MemoryBreakerStore(), Clock()
    for _ in range(3):
        primary_server.error(500, "boom")
        fallback_server.reply("backup")
        breaker(primary_server, fallback_server, store, clock).complete(
            MESSAGES, [], 64
        )
    clock.now += 31
    primary_server.error(400, "context too long")
    with pytest.raises(ModelError) as caught:
        breaker(primary_server, fallback_server, store, clock).complete(
            MESSAGES, [], 64
        )
    assert caught.value.kind == "bad_request"
    assert caught.value.routing and caught.value.routing["circuit"] == "trial"
    key = "tenant-1:main:gpt-main"
    assert store.admit(key, now=clock.now, settings=BreakerSettings()) == "closed"


def test_a_stream_dropped_by_the_primary_is_answered_whole_by_the_fallback(
    primary_server: ChatCompletionsServer, fallback_server: MessagesServer
) -> None:
    primary_server.push(Behaviour(reply=Reply(text="half of it"), drop_after=2))
    fallback_server.reply("the whole answer")
    deltas: list[str] = []
    discards: list[str] = []

    class Sink:
        def __call__(self, text: str) -> None:
            deltas.append(text)

        def discard(self, reason: str) -> None:
            discards.append(reason)
            deltas.clear()

    reply = breaker(
        primary_server, fallback_server, MemoryBreakerStore(), Clock()
    ).complete(MESSAGES, [], 64, on_delta=Sink())
    assert reply.text == "the whole answer" == "".join(deltas)
    assert discards[-1] == "fallback"
    assert reply.routing and reply.routing["fallback_reason"] == "stream_interrupted"


def test_no_time_left_for_the_fallback_is_the_primary_error(
    primary_server: ChatCompletionsServer, fallback_server: MessagesServer
) -> None:
    ticks = iter([0.0, 10.0])
    model = breaker(
        primary_server, fallback_server, MemoryBreakerStore(), Clock(),
        deadline_seconds=5.0, monotonic=lambda: next(ticks),
    )  # fmt: skip
    primary_server.error(500, "boom")
    with pytest.raises(ModelError) as caught:
        model.complete(MESSAGES, [], 64)
    assert caught.value.kind == "server"
    assert caught.value.routing and caught.value.routing["fallback_used"] is False
    assert fallback_server.requests == []
