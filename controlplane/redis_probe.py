"""One cheap question to Redis, shared by the system check and /healthz."""

from __future__ import annotations

import redis


def redis_problem(url: str, *, timeout: float) -> str | None:
    """Return None when Redis answers PING, else a one-line reason."""
    try:
        client = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, ValueError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
