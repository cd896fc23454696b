"""The Celery application shared by the web process, workers and beat."""

from __future__ import annotations

import contextlib
import importlib
import logging
import logging.config
import os
import secrets
import threading
import time
from collections.abc import Iterable
from typing import Any

import redis
from celery import Celery
from celery.concurrency import prefork
from celery.signals import (
    setup_logging,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_ready,
)
from django.conf import settings

from tracing.setup import configure_tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

logger = logging.getLogger(__name__)

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@setup_logging.connect
def _log_through_django_logging(**_: object) -> None:
    # Workers and beat log through the project's LOGGING, whose handlers redact
    # every record; without a receiver here Celery replaces the root handlers
    # with its own, unfiltered ones.
    logging.config.dictConfig(settings.LOGGING)


@task_prerun.connect
@task_postrun.connect
def _close_old_database_connections(**_: object) -> None:
    # As Django does around a request: a connection lives CONN_MAX_AGE and one
    # that failed is dropped (settings.CELERY_DB_REUSE_MAX keeps Celery's own
    # fixup from closing every connection around every task).
    from django.db import close_old_connections

    close_old_connections()


@worker_process_init.connect
def _configure_tracing_after_fork(**_: object) -> None:
    # Span processors and exporters hold threads and connections that do not
    # survive a fork: each worker process sets up its own.
    configure_tracing(force=True)


@worker_init.connect
def _import_the_model_sdk_before_the_fork(**_: object) -> None:
    # Once, in the worker's main process: a run's first step in a pool process
    # would otherwise spend seconds importing the SDK, during which its lease
    # renewal thread hardly ran (a short lease ran out under it).
    importlib.import_module("runs.engine.adapters.openai_compatible")
    importlib.import_module("runs.engine.adapters.anthropic_messages")


class TaskPool(prefork.TaskPool):
    """Celery's prefork pool, surviving the loss of a process as it starts.

    Celery checks once, as the worker starts consuming, that no pool process
    has exited yet, and stops the whole worker ("Could not start worker
    processes") if one has: a process killed then (the OOM killer, an
    operator) took down every run the worker was about to take. Such a process
    is replaced like one lost later; a pool that keeps dying still stops the
    worker (billiard's restart limit).
    """

    def did_start_ok(self) -> bool:
        if not super().did_start_ok():  # reaps the exited processes
            logger.warning("a pool process exited as the worker started; replacing it")
            self.maintain_pool()  # billiard's, bound as the pool started
        return True


# A worker's heartbeat: a key in the broker's Redis, renewed by its main process.
# Its absence says the worker is gone whole (its pool processes die with it), so
# recovery hands its runs on without waiting out their lease (runs.services.recovery).
WORKER_HEARTBEAT_SECONDS = 2.0
WORKER_SILENT_SECONDS = 10


def worker_alive_key(worker: str) -> str:
    return f"controlplane:worker-alive:{worker}"


class _Incarnation:
    """This start of the worker, drawn in its main process before the pool forks
    (children inherit it). A worker restarted under its node name (compose's
    restart policy keeps the container's host name) is a new incarnation: the
    heartbeat of the new one must not vouch for the steps the dead one held,
    which then waited out their lease (124 s in the soak's worker-kill)."""

    token = ""


@worker_init.connect
def _draw_incarnation(**_: object) -> None:
    _Incarnation.token = secrets.token_hex(4)


def worker_identity(hostname: str) -> str:
    """The worker as leases and heartbeats name it: node name and incarnation."""
    if not hostname or not _Incarnation.token:
        return hostname
    return f"{hostname}/{_Incarnation.token}"


@worker_ready.connect
def _start_heartbeat(sender: Any = None, **_: object) -> None:
    hostname = str(getattr(sender, "hostname", "") or "")
    if hostname:
        threading.Thread(
            target=_heartbeat,
            args=(worker_identity(hostname),),
            name="worker-heartbeat",
            daemon=True,
        ).start()


def _heartbeat(worker: str) -> None:
    client = redis.Redis.from_url(
        app.conf.broker_url, socket_timeout=2, socket_connect_timeout=2
    )
    key = worker_alive_key(worker)
    while True:
        # Redis down: recovery cannot read it either, and waits.
        with contextlib.suppress(redis.RedisError):
            client.set(key, "1", ex=WORKER_SILENT_SECONDS)
        time.sleep(WORKER_HEARTBEAT_SECONDS)


def workers_gone(workers: Iterable[str]) -> set[str]:
    """The workers (`worker_identity`) whose heartbeat stopped. None while Redis
    has been up for less than a heartbeat's life: after a restart the workers'
    keys may have lapsed during the outage. Raises redis.RedisError."""
    names = sorted(set(workers))
    if not names:
        return set()
    client = redis.Redis.from_url(app.conf.broker_url, socket_timeout=5)
    try:
        if int(client.info("server")["uptime_in_seconds"]) < WORKER_SILENT_SECONDS:
            return set()
        alive = client.mget([worker_alive_key(name) for name in names])
    finally:
        client.close()
    return {name for name, beat in zip(names, alive, strict=True) if beat is None}
