"""Tracing, OTLP ingest and the live stream."""

from __future__ import annotations

from controlplane.environment import env
from controlplane.settings.broker import CELERY_BEAT_SCHEDULE
from controlplane.settings.runs import RUN_LEASE_SECONDS

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
OTLP_INGEST_MAX_LOG_RECORDS = env.integer(
    "OTLP_INGEST_MAX_LOG_RECORDS",
    10_000,
    minimum=1,
    help="Most log records accepted in one POST /v1/logs or gRPC logs export "
    "(more: 413 / INVALID_ARGUMENT).",
)
OTLP_LOG_PENDING_HOURS = env.number(
    "OTLP_LOG_PENDING_HOURS",
    24.0,
    minimum=0.01,
    help="GenAI messages sent as log records wait this long for their span to "
    "arrive (an hourly task deletes older ones whose trace never came).",
)
# The OTLP/gRPC receiver (`manage.py otlp_grpc`, runs/otlp/grpc_server.py).
OTLP_GRPC_PORT = env.integer(
    "OTLP_GRPC_PORT",
    4317,
    minimum=0,
    help="Port of the OTLP/gRPC receiver (TraceService, LogsService); 0: any free.",
)
OTLP_GRPC_BIND = env.string(
    "OTLP_GRPC_BIND",
    "127.0.0.1",
    help="Address the OTLP/gRPC receiver binds (0.0.0.0 or :: for every interface).",
)
OTLP_GRPC_MAX_WORKERS = env.integer(
    "OTLP_GRPC_MAX_WORKERS",
    8,
    minimum=1,
    help="Threads of the OTLP/gRPC receiver: exports it stores at once.",
)
OTLP_GRPC_MAX_CONCURRENT_RPCS = env.integer(
    "OTLP_GRPC_MAX_CONCURRENT_RPCS",
    32,
    minimum=1,
    help="Exports the OTLP/gRPC receiver holds at once (running or queued); "
    "more are answered RESOURCE_EXHAUSTED at once.",
)
OTLP_GRPC_DEADLINE_SECONDS = env.number(
    "OTLP_GRPC_DEADLINE_SECONDS",
    30.0,
    minimum=0.1,
    help="An OTLP/gRPC call must have sent its request within this long of being "
    "picked up, or it is cut (CANCELLED) and its thread freed.",
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
CELERY_BEAT_SCHEDULE["tracing-expire-log-messages"] = {
    "task": "runs.tasks.expire_pending_log_messages_task",
    "schedule": 3600.0,
}
CELERY_BEAT_SCHEDULE["tracing-abandon-spans"] = {
    "task": "runs.tasks.abandon_expired_spans_task",
    "schedule": 60.0,
}
