"""The model endpoints' circuit breakers, shared by every worker through Redis.

The breaker's rules are the engine's (runs.engine.adapters.breaker); this is its
`BreakerStore`: one hash per endpoint+model (`failures`, `open_until`,
`trial_until`), each operation one Lua script, so the workers agree on when a
circuit opens and which one of them makes the half-open trial. Keys expire a
while after their last failure, so failures far apart are not consecutive.

Redis is the shared cache's (settings.CACHES). A breaker store that cannot reach
Redis fails open: the call goes to the endpoint as if the circuit were closed,
and the failure is logged; the breaker never fails a run on its own.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import redis
from django.conf import settings

from runs.engine.adapters.breaker import Admission, BreakerSettings, BreakerState

__all__ = ["RedisBreakerStore", "breaker_key", "breaker_store"]

logger = logging.getLogger(__name__)

KEY_PREFIX = "cp:breaker:"
MIN_TTL_SECONDS = 600

_ADMIT = """
local open_until = tonumber(redis.call('HGET', KEYS[1], 'open_until') or '0')
if open_until == 0 then return 'closed' end
local now = tonumber(ARGV[1])
local trial_until = tonumber(redis.call('HGET', KEYS[1], 'trial_until') or '0')
if now < open_until or now < trial_until then return 'open' end
redis.call('HSET', KEYS[1], 'trial_until', tostring(now + tonumber(ARGV[2])))
return 'trial'
"""

_FAILURE = """
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
local was_open = tonumber(redis.call('HGET', KEYS[1], 'open_until') or '0')
local opened = 0
if ARGV[4] == '1' or failures >= tonumber(ARGV[2]) then
  local open_until = tostring(tonumber(ARGV[1]) + tonumber(ARGV[3]))
  redis.call('HSET', KEYS[1], 'open_until', open_until, 'trial_until', '0')
  opened = 1
else
  redis.call('HSET', KEYS[1], 'trial_until', '0')
  if was_open > 0 then opened = 1 end
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
return opened
"""


def breaker_key(*, tenant_id: object, endpoint_id: object, model: str) -> str:
    """One circuit per tenant endpoint and model (a model may be overloaded
    while the endpoint's others answer)."""
    return f"{tenant_id}:{endpoint_id}:{model}"


class RedisBreakerStore:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._admit = client.register_script(_ADMIT)
        self._failure = client.register_script(_FAILURE)

    def admit(self, key: str, *, now: float, settings: BreakerSettings) -> Admission:
        try:
            answer = self._admit(
                keys=[KEY_PREFIX + key], args=[repr(now), repr(settings.trial_seconds)]
            )
        except redis.RedisError:
            logger.warning("model breaker: Redis unreachable, circuit taken as closed")
            return "closed"
        value = answer.decode() if isinstance(answer, bytes) else str(answer)
        if value == "open":
            return "open"
        return "trial" if value == "trial" else "closed"

    def success(self, key: str) -> None:
        try:
            self.client.delete(KEY_PREFIX + key)
        except redis.RedisError:
            logger.warning("model breaker: Redis unreachable, a success not recorded")

    def failure(
        self, key: str, *, now: float, settings: BreakerSettings, trial: bool
    ) -> bool:
        window = settings.cooldown_seconds + settings.trial_seconds
        ttl = int(max(MIN_TTL_SECONDS, 4 * window))
        try:
            opened = self._failure(
                keys=[KEY_PREFIX + key],
                args=[
                    repr(now),
                    settings.failure_threshold,
                    repr(settings.cooldown_seconds),
                    "1" if trial else "0",
                    ttl,
                ],
            )
        except redis.RedisError:
            logger.warning("model breaker: Redis unreachable, a failure not counted")
            return False
        return bool(int(opened))

    def state(self, key: str) -> BreakerState:
        try:
            raw: dict[Any, Any] = self.client.hgetall(KEY_PREFIX + key)
        except redis.RedisError:
            return BreakerState()

        def number(name: str) -> float:
            value = raw.get(name.encode(), raw.get(name, b"0"))
            return float(value.decode() if isinstance(value, bytes) else value)

        return BreakerState(
            failures=int(number("failures")),
            open_until=number("open_until"),
            trial_until=number("trial_until"),
        )


_lock = threading.Lock()
_store: tuple[int, str, RedisBreakerStore] | None = None


def breaker_store() -> RedisBreakerStore:
    """This process's store (a forked worker makes its own connection pool)."""
    global _store
    url = str(settings.CACHES["default"]["LOCATION"])
    with _lock:
        if _store is None or _store[0] != os.getpid() or _store[1] != url:
            client = redis.Redis.from_url(
                url, socket_timeout=1.0, socket_connect_timeout=1.0
            )
            _store = (os.getpid(), url, RedisBreakerStore(client))
        return _store[2]
