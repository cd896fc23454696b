"""A worker keeps its database connection across tasks (Celery's Django fixup
would close it around every task: a reconnect per step) and drops it as Django
does around a request: at CONN_MAX_AGE (or, on PostgreSQL, once it failed)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from celery.fixups.django import DjangoWorkerFixup
from django.db import connection

from controlplane.celery import _close_old_database_connections
from controlplane.celery import app as celery_app


def _task() -> Any:
    return SimpleNamespace(request=SimpleNamespace(is_eager=False))


@pytest.mark.django_db(transaction=True)
def test_a_connection_outlives_the_tasks_around_it() -> None:
    # On PostgreSQL the connection goes back to the process's pool after each
    # task and the next task takes one from it (a worker process's pool holds the
    # one its single thread uses; this test process's may hold more); on SQLite
    # it is kept. Either way no task opens a connection of its own.
    fixup = DjangoWorkerFixup(celery_app)
    connection.ensure_connection()
    opened = connection.connection
    pool = getattr(connection, "pool", None)
    connects = pool.get_stats()["connections_num"] if pool else 0
    used = []
    for _ in range(3):
        fixup.on_task_prerun(sender=_task())
        _close_old_database_connections()
        connection.cursor().execute("SELECT 1")
        used.append(connection.connection)
        fixup.on_task_postrun(sender=_task())
        _close_old_database_connections()
    if pool is None:
        assert all(raw is opened for raw in used)
    else:
        assert pool.get_stats()["connections_num"] == connects


@pytest.mark.django_db(transaction=True)
def test_a_connection_past_its_max_age_is_dropped_after_a_task() -> None:
    connection.ensure_connection()
    connection.close_at = time.monotonic() - 1  # past CONN_MAX_AGE
    _close_old_database_connections()
    assert connection.connection is None
    connection.cursor().execute("SELECT 1")  # the next task reconnects
