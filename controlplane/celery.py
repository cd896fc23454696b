"""The Celery application shared by the web process, workers and beat."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_init.connect
def _configure_tracing_after_fork(**_: object) -> None:
    # Span processors and exporters hold threads and connections that do not
    # survive a fork: each worker process sets up its own.
    from tracing.setup import configure_tracing

    configure_tracing(force=True)
