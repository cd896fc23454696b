"""Transactions whose loss in a database crash is recoverable."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connection, transaction

__all__ = ["recoverable_transaction"]


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
