"""Transactions whose loss in a database crash is recoverable."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from django.db import InterfaceError, OperationalError, connection, transaction

__all__ = ["connection_lost", "recoverable_transaction"]


@contextlib.contextmanager
def recoverable_transaction() -> Iterator[None]:
    """`transaction.atomic()` whose commit, when it is the outermost transaction on
    PostgreSQL, does not wait for the WAL flush (`synchronous_commit = off` for
    this transaction only; a flush costs milliseconds on a busy disk).

    A database crash may lose the last such commits, never a later durable one
    (the WAL is flushed in order). Use it only for writes whose loss the system
    recovers from: telemetry, and a step's bookkeeping that a lost lease or a
    re-run step repeats. A write that must precede an irreversible effect (the
    `executing` mark before a tool with side effects, a human's decision, money
    in the budget ledger, a run's outcome) stays durable.
    """
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        yield


# SQLSTATEs of a connection PostgreSQL ended: class 08 (connection exception),
# and the server shutting down or starting (admin_shutdown, crash_shutdown,
# cannot_connect_now).
LOST_CONNECTION_STATES = ("08", "57P01", "57P02", "57P03")


def connection_lost(exc: BaseException) -> bool:
    """Whether `exc` is the database connection dying, as opposed to an error
    the database answered on a live one (a deadlock, a cancelled statement).

    Read from the driver's error, not from the connection: by the time the
    error leaves `transaction.atomic`, Django has dropped the broken connection
    and taken a new one from the pool."""
    if not isinstance(exc, (OperationalError, InterfaceError)):
        return False
    cause = exc.__cause__
    if not isinstance(cause, psycopg.Error):
        return False  # SQLite's (a locked file is no lost connection)
    state = cause.sqlstate
    # None: raised by the client (the socket closed, no connection to be had).
    return state is None or str(state).startswith(LOST_CONNECTION_STATES)
