"""Probes of the web process, each answered for real.

- `/livez`: this process answers (nothing else is asked): restart it when not.
- `/readyz`: it can serve, its database and Redis answer: route traffic to it.
- `/healthz`: the report for people and the dev launcher, readiness plus
  whether a Celery worker answers a ping. 503 names the failing part; a slow or
  missing worker is no reason to restart or unroute the web process, so
  deployments probe `/livez` and `/readyz`, and workers have their own checks.
"""

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
def livez(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    parts = {"database": database_status(), "redis": redis_status()}
    ready = all(value == "ok" for value in parts.values())
    return JsonResponse(
        {**parts, "status": "ok" if ready else "error"},
        status=200 if ready else 503,
    )


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
