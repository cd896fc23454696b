"""Prometheus metrics for operators (docs/architecture.md "Metrics").

Every process (Daphne, each Celery pool child, beat) records into its own files in
PROMETHEUS_MULTIPROC_DIR (prometheus-client's multiprocess mode, chosen by that
variable when the library is imported); GET /metrics adds them up, then adds the
gauges read at scrape time: the Celery queue's depth from Redis and whatever the
apps register in settings.METRICS_COLLECTORS (runs waiting, queue age: the database).

Recording is a few calls at existing points, each cheap and never raising into
the caller's work. Labels are closed sets (statuses, stop reasons, tool names,
error codes, causes), never a tenant or run id.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from typing import Any

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.module_loading import import_string
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.authentication import AuthenticationRefused, bearer_secret

logger = logging.getLogger(__name__)

_MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
if _MULTIPROC_DIR:
    # A process that reuses the pid of a dead one (PID 1 in a restarted container)
    # must not inherit its live gauges (WebSocket clients).
    multiprocess.mark_process_dead(os.getpid(), _MULTIPROC_DIR)  # type: ignore[no-untyped-call]

# Seconds: a step is one model call or tool batch plus its writes; a model call
# may take a minute; a human decides in seconds to a day.
_STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_DECISION_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600)

RUNS_STARTED = Counter("controlplane_runs_started", "Runs started (committed).")
RUNS_ENDED = Counter(
    "controlplane_runs_ended",
    "Runs that ended, by final status and stop reason.",
    ["status", "stop_reason"],
)
STEP_SECONDS = Histogram(
    "controlplane_step_duration_seconds",
    "Wall time of one advance_run_task, by what it did.",
    ["outcome"],
    buckets=_STEP_BUCKETS,
)
MODEL_CALL_SECONDS = Histogram(
    "controlplane_model_call_duration_seconds",
    "Wall time of one model call, by result (ok or error).",
    ["result"],
    buckets=_STEP_BUCKETS,
)
TOOL_CALLS = Counter(
    "controlplane_tool_calls", "Tool calls that ended, by tool and status.",
    ["tool", "status"],
)  # fmt: skip
TOOL_ERRORS = Counter(
    "controlplane_tool_errors", "Failed or refused tool calls, by tool and error code.",
    ["tool", "code"],
)  # fmt: skip
SANDBOX_TERMINATIONS = Counter(
    "controlplane_sandbox_terminations",
    "Sandboxed programs that ended, by termination cause.",
    ["cause"],
)
SPEND_COST = Counter(
    "controlplane_spend_cost", "Money spent (the price table's currency), by kind.",
    ["kind"],
)  # fmt: skip
MODEL_TOKENS = Counter(
    "controlplane_model_tokens", "Billed model tokens, by direction.", ["direction"]
)
BUDGET_REFUSALS = Counter(
    "controlplane_budget_refusals", "Calls refused by a budget, by dimension.",
    ["dimension"],
)  # fmt: skip
APPROVAL_DECISION_SECONDS = Histogram(
    "controlplane_approval_time_to_decision_seconds",
    "From an approval request to its final decision, by outcome.",
    ["decision"],
    buckets=_DECISION_BUCKETS,
)
WEBSOCKET_CLIENTS = Gauge(
    "controlplane_websocket_clients",
    "Open WebSocket streams (summed over live web processes).",
    multiprocess_mode="livesum",
)
RECOVERIES = Counter(
    "controlplane_recoveries", "Runs re-enqueued by the stalled-run recovery."
)


def _safely(record: Callable[..., None]) -> Callable[..., None]:
    """A metric must never fail the work it measures."""

    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            record(*args, **kwargs)
        except Exception:  # pragma: no cover - defensive: a full disk, a bad label
            logger.warning("metrics: %s failed", record.__name__, exc_info=True)

    wrapper.__name__ = record.__name__
    wrapper.__doc__ = record.__doc__
    return wrapper


@_safely
def run_started() -> None:
    RUNS_STARTED.inc()


@_safely
def run_ended(*, status: str, stop_reason: str) -> None:
    RUNS_ENDED.labels(status=status, stop_reason=stop_reason).inc()


@_safely
def step_observed(*, outcome: str, seconds: float) -> None:
    STEP_SECONDS.labels(outcome=outcome).observe(seconds)


@_safely
def model_call_observed(*, ok: bool, seconds: float) -> None:
    MODEL_CALL_SECONDS.labels(result="ok" if ok else "error").observe(seconds)


@_safely
def tool_call_ended(*, tool: str, status: str, code: str | None) -> None:
    TOOL_CALLS.labels(tool=tool, status=status).inc()
    if code:
        TOOL_ERRORS.labels(tool=tool, code=code).inc()


@_safely
def sandbox_terminated(*, cause: str) -> None:
    SANDBOX_TERMINATIONS.labels(cause=cause).inc()


@_safely
def spend_recorded(
    *, kind: str, cost: Decimal, input_tokens: int = 0, output_tokens: int = 0
) -> None:
    if cost:
        SPEND_COST.labels(kind=kind).inc(float(cost))
    if input_tokens:
        MODEL_TOKENS.labels(direction="input").inc(input_tokens)
    if output_tokens:
        MODEL_TOKENS.labels(direction="output").inc(output_tokens)


@_safely
def budget_refused(*, dimension: str) -> None:
    BUDGET_REFUSALS.labels(dimension=dimension).inc()


@_safely
def approval_decided(*, decision: str, seconds: float) -> None:
    APPROVAL_DECISION_SECONDS.labels(decision=decision).observe(max(seconds, 0.0))


@_safely
def websocket_opened() -> None:
    WEBSOCKET_CLIENTS.inc()


@_safely
def websocket_closed() -> None:
    WEBSOCKET_CLIENTS.dec()


@_safely
def runs_recovered(*, count: int) -> None:
    if count:
        RECOVERIES.inc(count)


class _ScrapeTimeGauges(Collector):
    """Read when scraped, from Redis and the apps' collectors (settings)."""

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "controlplane_queue_depth",
            "Step messages waiting in the Celery queue (Redis), -1 when unreachable.",
        )
        depth.add_metric([], _queue_depth())
        yield depth
        for path in settings.METRICS_COLLECTORS:
            collector: Callable[[], Iterable[Metric]] = import_string(path)
            try:
                yield from collector()
            except Exception:
                logger.warning("metrics: collector %s failed", path, exc_info=True)


class _ThisProcess(Collector):
    """Without a multiprocess directory: the metrics of this process only."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def _queue_depth() -> float:
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    try:
        client = redis.Redis.from_url(
            settings.CELERY_BROKER_URL, socket_timeout=1, socket_connect_timeout=1
        )
        with client:
            # kombu's Redis transport keeps a list per queue (priority 0 is the
            # plain name; the others carry a separator and the priority).
            names = [queue, *(f"{queue}\x06\x16{p}" for p in (3, 6, 9))]
            return float(sum(int(client.llen(name)) for name in names))
    except redis.RedisError:
        return -1.0


def metrics_exposition() -> bytes:
    registry = CollectorRegistry()
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
    if directory:
        multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    else:
        registry.register(_ThisProcess())
    registry.register(_ScrapeTimeGauges())
    return generate_latest(registry)


def _authorized(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    # The header is read as every door reads it; the secret is the scrape's own
    # (METRICS_TOKEN), not a tenant's API token.
    try:
        presented = bearer_secret(request.headers.get("Authorization"))
    except AuthenticationRefused:
        return False
    if token and presented is not None:
        return hmac.compare_digest(presented.encode(), token.encode())
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.is_staff)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """GET /metrics: the Prometheus text format, for METRICS_TOKEN or staff."""
    if request.method != "GET":
        return JsonResponse(
            {"error": {"code": "method_not_allowed", "message": "use GET"}},
            status=405,
        )
    if not _authorized(request):
        return JsonResponse(
            {
                "error": {
                    "code": "not_authenticated",
                    "message": "send Authorization: Bearer <METRICS_TOKEN>, or sign "
                    "in as a staff user",
                }
            },
            status=401,
        )
    return HttpResponse(metrics_exposition(), content_type=CONTENT_TYPE_LATEST)
