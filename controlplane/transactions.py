"""Transactions whose loss in a database crash is recoverable."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

from django.db import connection, transaction

from controlplane.rows import FirstStatement, Select, Statement, statements_run

__all__ = ["recoverable_transaction", "recoverable_write", "sub_transaction"]

# set_config, not SET LOCAL: in a pipeline the server takes SET LOCAL with a
# warning that it is outside a transaction block (it is not, until the sync).
_SYNC_COMMIT_OFF = "SELECT set_config('synchronous_commit', 'off', true)"


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
            setting = FirstStatement(_SYNC_COMMIT_OFF, prepare=True)
            with connection.execute_wrapper(setting):
                yield
        else:
            yield


def recoverable_write(write: Statement, *reads: Select) -> list[Any]:
    """One write statement as a recoverable transaction of its own (see
    `recoverable_transaction`), then `reads`; the rows the write changed, then
    what each read found. Outside a transaction it is one round trip on
    PostgreSQL (the setting, the write and the reads go together, as one
    implicit transaction) and one write statement on SQLite, instead of BEGIN
    and COMMIT around it. Inside one, it joins the caller's."""
    if connection.in_atomic_block or connection.vendor != "postgresql":
        return statements_run([write, *reads])
    return statements_run([Statement(_SYNC_COMMIT_OFF, []), write, *reads])[1:]


_sub_transactions = itertools.count(1)  # savepoint names


@contextlib.contextmanager
def sub_transaction() -> Iterator[None]:
    """A savepoint in the caller's transaction (or a recoverable transaction
    when there is none): on an exception, what ran inside is rolled back, its
    commit hooks dropped, and the caller's transaction goes on.

    On PostgreSQL the savepoint costs no round trip of its own: it goes with
    the first statement inside and is never released (the transaction's end
    releases it), where `transaction.atomic()` sends SAVEPOINT and RELEASE each
    on their own."""
    if not connection.in_atomic_block:
        with recoverable_transaction():
            yield
        return
    if connection.vendor != "postgresql":
        with transaction.atomic():
            yield
        return
    name = f"cp_sub_{next(_sub_transactions)}"
    hooks = len(connection.run_on_commit)
    first = FirstStatement(f"SAVEPOINT {name}")
    try:
        with connection.execute_wrapper(first):
            yield
    except BaseException:
        del connection.run_on_commit[hooks:]
        if first.sent:
            try:
                with connection.cursor() as cursor:
                    cursor.execute(f"ROLLBACK TO SAVEPOINT {name}")
            except Exception:
                connection.needs_rollback = True  # the caller's is lost too
                raise
        # As Django does after rolling back to a savepoint: an atomic block
        # inside that failed without its own savepoint asked for a rollback.
        connection.needs_rollback = False
        raise
