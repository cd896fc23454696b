"""The SQLite backend (controlplane/db): writers queue on a file lock, and WAL
checkpoints run after a commit has released it, never inside one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db.utils import ConnectionHandler

from controlplane.db.base import CHECKPOINT_EVERY
from controlplane.settings.database import _database


@pytest.fixture
def sqlite(tmp_path: Path, django_db_blocker: Any) -> Iterator[Any]:
    """A connection of our backend to a SQLite file of its own (whatever
    database the suite runs on)."""
    handler = ConnectionHandler({"default": _database(f"sqlite:///{tmp_path}/t.db")})
    with django_db_blocker.unblock():
        wrapper = handler["default"]
        with wrapper.cursor() as cursor:
            cursor.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, n INTEGER)")
        yield wrapper
        wrapper.close()


def write_transaction(wrapper: Any, n: int) -> None:
    wrapper._start_transaction_under_autocommit()  # as transaction.atomic does
    with wrapper.cursor() as cursor:
        cursor.execute("INSERT INTO item (n) VALUES (%s)", [n])
    wrapper.commit()


def test_sqlite_never_checkpoints_inside_a_commit(sqlite: Any) -> None:
    with sqlite.cursor() as cursor:
        cursor.execute("PRAGMA wal_autocheckpoint")
        assert cursor.fetchone() == (0,)
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone() == ("wal",)


def test_a_checkpoint_runs_every_so_many_commits_with_the_writer_lock_free(
    sqlite: Any,
) -> None:
    checkpoints: list[bool] = []  # whether the writer lock was held at each

    def traced(sql: str) -> None:
        if "wal_checkpoint" in sql:
            checkpoints.append(sqlite._writer_held)

    sqlite.connection.set_trace_callback(traced)
    for n in range(CHECKPOINT_EVERY - 1):
        write_transaction(sqlite, n)
    assert checkpoints == []
    write_transaction(sqlite, CHECKPOINT_EVERY)
    assert checkpoints == [False]
    with sqlite.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM item")
        assert cursor.fetchone() == (CHECKPOINT_EVERY,)  # every commit stands


def test_a_write_transaction_holds_the_writer_lock_until_its_commit(
    sqlite: Any,
) -> None:
    sqlite._start_transaction_under_autocommit()
    assert sqlite._writer_held
    with sqlite.cursor() as cursor:
        cursor.execute("INSERT INTO item (n) VALUES (1)")
    assert sqlite._writer_held
    sqlite.commit()
    assert not sqlite._writer_held


def test_writes_outside_a_transaction_queue_for_the_writer_lock(
    sqlite: Any,
) -> None:
    """A write of its own (autocommit) takes the writer lock while it runs, a
    read does not."""
    held: list[tuple[str, bool]] = []
    sqlite.ensure_connection()
    sqlite.connection.set_trace_callback(
        lambda sql: held.append((sql.split()[0], sqlite._writer_held))
    )
    with sqlite.cursor() as cursor:
        cursor.execute("INSERT INTO item (n) VALUES (%s), (%s)", [1, 2])
        cursor.execute("UPDATE item SET n = %s WHERE n = %s", [3, 2])
        cursor.execute("SELECT n FROM item")
    assert held == [("INSERT", True), ("UPDATE", True), ("SELECT", False)]
    assert not sqlite._writer_held
    with sqlite.cursor() as cursor:
        cursor.execute("SELECT n FROM item ORDER BY id")
        assert cursor.fetchall() == [(1,), (3,)]  # each committed on its own
