"""The test suite's own database flush: a transactional test's TRUNCATE that
deadlocks with a query another process still runs (Daphne, a worker) is not
left half done; the next test would start on the rows left behind."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from django.core.management.color import no_style
from django.db import connection
from django.test import TransactionTestCase

from controlplane.models import Tenant
from tests.conftest import database_url_for_subprocess, wait_for

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="a PostgreSQL lock deadlock"
)


def test_a_flush_that_deadlocks_with_a_reader_flushes_again(
    transactional_db: Any, tenant: Any
) -> None:
    tables = connection.introspection.django_table_names(
        only_existing=True, include_views=False
    )
    truncate = connection.ops.sql_flush(no_style(), tables)[0]
    named = [t for t in tables if f'"{t}"' in truncate]
    named.sort(key=lambda t: truncate.index(f'"{t}"'))
    first, last = named[0], named[-1]
    reader = psycopg.connect(database_url_for_subprocess(), autocommit=False)
    holding = threading.Event()
    flushed: list[BaseException | None] = []

    def read_last_then_first() -> None:
        # Reads the TRUNCATE's last table, and once the TRUNCATE holds its
        # first and waits for the last, reads the first: each waits on the other.
        with reader.cursor() as cursor:
            cursor.execute(f'SELECT 1 FROM "{last}" LIMIT 1')
            holding.set()
            wait_for(lambda: truncate_waits(reader), timeout=30, what="TRUNCATE waits")
            cursor.execute(f'SELECT 1 FROM "{first}" LIMIT 1')
        reader.commit()

    def flush() -> None:
        case = TransactionTestCase.__new__(TransactionTestCase)
        try:
            TransactionTestCase.__dict__["_fixture_teardown"](case)
            flushed.append(None)
        except BaseException as error:  # noqa: BLE001 - reported below
            flushed.append(error)
        finally:
            connection.close()

    before = deadlocks()
    holder = threading.Thread(target=read_last_then_first)
    holder.start()
    assert holding.wait(30)
    flusher = threading.Thread(target=flush)
    flusher.start()
    holder.join(60)
    flusher.join(60)
    reader.close()
    assert flushed == [None]
    # PostgreSQL did cancel a TRUNCATE (its statistics come a moment later).
    wait_for(lambda: deadlocks() > before, timeout=30, what="a deadlock counted")
    assert not Tenant.objects.exists()


def truncate_waits(reader: psycopg.Connection[Any]) -> bool:
    with psycopg.connect(database_url_for_subprocess(), autocommit=True) as other:
        row = other.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE NOT l.granted AND a.query LIKE 'TRUNCATE%%' AND a.pid <> %s",
            [reader.info.backend_pid],
        ).fetchone()
    return bool(row and row[0])


def deadlocks() -> int:
    with psycopg.connect(database_url_for_subprocess(), autocommit=True) as other:
        row = other.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0
