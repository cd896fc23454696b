"""SQLite, with writers queued on a file lock instead of SQLite's busy handler.

The web, worker and beat processes share one SQLite file, which takes one writer
at a time. A writer that finds it locked is put to sleep by SQLite and retries
after 1, 2, 5, 10… ms, so with two workers stepping runs much of their time went
to those sleeps. Here a write transaction (and a write statement outside one)
first takes an exclusive `flock` on a file beside the database, which the kernel
hands to the next waiter the moment it is released; SQLite's own lock then never
makes anyone sleep. Readers (WAL) take nothing.

SQLite copies the WAL back into the database (a checkpoint, with an fsync) inside
the commit that crosses `wal_autocheckpoint`, which here would hold the lock for
milliseconds while every other writer waits. Connections checkpoint themselves
instead, every CHECKPOINT_EVERY commits, after releasing the lock: a
passive checkpoint runs beside the next writer.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import sqlite3
from collections.abc import Iterator
from typing import Any

from django.db.backends.sqlite3 import base

logger = logging.getLogger(__name__)

CHECKPOINT_EVERY = 100  # commits of one connection between checkpoints
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER")


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._writer_file: Any = None
        self._writer_held = False
        self._writes = 0
        self.execute_wrappers.append(self._queue_autocommit_write)

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = super().get_new_connection(conn_params)
        if self._writer_file is None and not self.is_in_memory_db():
            name = str(self.settings_dict["NAME"])
            self._writer_file = open(f"{name}-writer.lock", "a")  # noqa: SIM115
        connection.execute("PRAGMA wal_autocheckpoint=0")
        return connection

    def _writer_acquire(self) -> bool:
        if self._writer_file is None or self._writer_held:
            return False
        fcntl.flock(self._writer_file.fileno(), fcntl.LOCK_EX)
        self._writer_held = True
        return True

    def _writer_release(self) -> None:
        if self._writer_held:
            self._writer_held = False
            fcntl.flock(self._writer_file.fileno(), fcntl.LOCK_UN)

    def _start_transaction_under_autocommit(self) -> None:
        taken = self._writer_acquire()  # BEGIN IMMEDIATE takes SQLite's lock
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]
        except BaseException:
            if taken:
                self._writer_release()
            raise

    def _commit(self) -> None:
        try:
            super()._commit()  # type: ignore[misc]
        finally:
            self._writer_release()
        self._checkpoint_when_due()

    def _checkpoint_when_due(self) -> None:
        self._writes += 1
        if self._writes % CHECKPOINT_EVERY or self.is_in_memory_db():
            return
        try:
            self.connection.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error:  # the commit stands; the next one tries again
            logger.warning("sqlite: WAL checkpoint failed", exc_info=True)

    def _rollback(self) -> None:
        try:
            super()._rollback()  # type: ignore[misc]
        finally:
            self._writer_release()

    def _close(self) -> None:
        try:
            super()._close()  # type: ignore[misc]
        finally:
            self._writer_release()
            if self._writer_file is not None:
                self._writer_file.close()
                self._writer_file = None

    @contextlib.contextmanager
    def writer_queued(self, sql: str) -> Iterator[None]:
        """Around running `sql` (and reading its result: an INSERT … RETURNING
        commits when its last row is read): a write outside a transaction is a
        transaction of its own, so it queues for the writer lock."""
        taken = (
            not self.in_atomic_block
            and sql.lstrip()[:7].upper().startswith(_WRITES)
            and self._writer_acquire()
        )
        try:
            yield
        finally:
            if taken:
                self._writer_release()

    def _queue_autocommit_write(
        self, execute: Any, sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        with self.writer_queued(sql):
            return execute(sql, params, many, context)
