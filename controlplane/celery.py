"""The Celery application shared by the web process, workers and beat."""

from __future__ import annotations

import logging
import os

from celery import Celery
from celery.concurrency import prefork
from celery.signals import task_postrun, task_prerun, worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

logger = logging.getLogger(__name__)

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


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
    from tracing.setup import configure_tracing

    configure_tracing(force=True)


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
