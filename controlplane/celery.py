"""The Celery application shared by the web process, workers and beat."""

from __future__ import annotations

import importlib
import logging.config
import os

from celery import Celery
from celery.signals import (
    setup_logging,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
)
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

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
    from tracing.setup import configure_tracing

    configure_tracing(force=True)


@worker_init.connect
def _import_the_model_sdk_before_the_fork(**_: object) -> None:
    # Once, in the worker's main process: a run's first step in a pool process
    # would otherwise spend seconds importing the SDK, during which its lease
    # renewal thread hardly ran (a short lease ran out under it).
    importlib.import_module("runs.engine.adapters.openai_compatible")
