"""The circuit breaker's shared state in the real Redis: every worker sees one
circuit, and one of them makes the half-open trial."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings

from runs.breaker import RedisBreakerStore, breaker_key, breaker_store
from runs.devserver import ChatCompletionsServer
from runs.engine.adapters import ModelError
from runs.engine.adapters.breaker import BreakerSettings, CircuitBreakerModel, Endpoint
from runs.engine.adapters.openai_compatible import OpenAIModel

SETTINGS = BreakerSettings(failure_threshold=3, cooldown_seconds=30, trial_seconds=60)
NOW = 1_700_000_000.0


def worker_store() -> RedisBreakerStore:
    """A store on a connection of its own, as another worker process has."""
    return RedisBreakerStore(
        redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    )


@pytest.fixture
def key() -> Iterator[str]:
    name = breaker_key(tenant_id=uuid.uuid4(), endpoint_id=7, model="gpt-x")
    yield name
    breaker_store().success(name)


def test_three_failures_from_different_workers_open_one_circuit(key: str) -> None:
    a, b = worker_store(), worker_store()
    assert a.failure(key, now=NOW, settings=SETTINGS, trial=False) is False
    assert b.failure(key, now=NOW + 1, settings=SETTINGS, trial=False) is False
    assert a.admit(key, now=NOW + 2, settings=SETTINGS) == "closed"
    assert b.failure(key, now=NOW + 2, settings=SETTINGS, trial=False) is True
    assert a.admit(key, now=NOW + 3, settings=SETTINGS) == "open"
    state = b.state(key)
    assert state.failures == 3 and state.open_until == pytest.approx(NOW + 32)
    # The key expires, so failures far apart are not "consecutive".
    ttl = a.client.ttl("cp:breaker:" + key)
    assert int(ttl) >= 600


def test_after_the_cool_down_exactly_one_worker_makes_the_trial(key: str) -> None:
    store = worker_store()
    for _ in range(3):
        store.failure(key, now=NOW, settings=SETTINGS, trial=False)
    answers: list[str] = []
    workers = [worker_store() for _ in range(8)]
    barrier = threading.Barrier(len(workers))

    def ask(worker: RedisBreakerStore) -> None:
        barrier.wait()
        answers.append(worker.admit(key, now=NOW + 31, settings=SETTINGS))

    threads = [threading.Thread(target=ask, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(answers) == ["open"] * 7 + ["trial"]
    # The trial failed: open for another cool-down, then a new trial.
    assert store.failure(key, now=NOW + 32, settings=SETTINGS, trial=True) is True
    assert store.admit(key, now=NOW + 61, settings=SETTINGS) == "open"
    assert store.admit(key, now=NOW + 63, settings=SETTINGS) == "trial"
    store.success(key)
    assert store.admit(key, now=NOW + 64, settings=SETTINGS) == "closed"
    assert store.state(key).failures == 0


def test_a_store_without_redis_fails_open() -> None:
    dead = RedisBreakerStore(
        redis.Redis(host="127.0.0.1", port=9, socket_connect_timeout=0.2)
    )
    assert dead.admit("k", now=NOW, settings=SETTINGS) == "closed"
    assert dead.failure("k", now=NOW, settings=SETTINGS, trial=False) is False
    dead.success("k")
    assert dead.state("k").failures == 0


def test_the_breaker_model_on_redis_fails_fast_once_open(key: str) -> None:
    with ChatCompletionsServer() as server:
        for _ in range(3):
            server.error(503, "unavailable")

        def model() -> CircuitBreakerModel:
            adapter = OpenAIModel(
                model="gpt-x", api_key="k", base_url=server.base_url, max_retries=0
            )
            return CircuitBreakerModel(
                Endpoint(adapter, "main", "gpt-x", key),
                store=breaker_store(),
                settings=SETTINGS,
            )

        for _ in range(3):
            with pytest.raises(ModelError):
                model().complete([{"role": "user", "content": "hi"}], [], 16)
        with pytest.raises(ModelError) as caught:
            model().complete([{"role": "user", "content": "hi"}], [], 16)
        assert caught.value.kind == "circuit_open"
        assert len(server.requests) == 3
