"""/healthz: database, Redis and a Celery worker, each answered for real."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from controlplane import redis_probe
from controlplane.celery import app as celery_app


def database_status() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any driver error means "not ok"
        return f"error: {type(exc).__name__}"
    return "ok"


def redis_status() -> str:
    problem = redis_probe.redis_problem(celery_app.conf.broker_url, timeout=1.0)
    return "ok" if problem is None else f"error: {problem.split(':')[0]}"


def worker_status() -> str:
    try:
        replies = celery_app.control.ping(
            timeout=settings.HEALTH_WORKER_TIMEOUT, limit=1
        )
    except Exception as exc:  # broker down: reported by the redis part too
        return f"error: {type(exc).__name__}"
    return "ok" if replies else "error: no worker answered a ping"


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    parts = {
        "database": database_status(),
        "redis": redis_status(),
    }
    parts["worker"] = worker_status() if parts["redis"] == "ok" else "error: no redis"
    healthy = all(value == "ok" for value in parts.values())
    return JsonResponse(
        {**parts, "status": "ok" if healthy else "error"},
        status=200 if healthy else 503,
    )
