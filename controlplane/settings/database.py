"""The database: SQLite by default, PostgreSQL through a pool per process."""

from __future__ import annotations

import os
from typing import Any

import dj_database_url

from controlplane.environment import env
from controlplane.settings.base import BASE_DIR

DATABASE_URL = env.string(
    "DATABASE_URL",
    f"sqlite:///{BASE_DIR / 'db.sqlite3'}",
    help="Database URL (postgres://user@host:5432/name); SQLite file by default.",
)


# PostgreSQL connections come from a pool of fixed size per process (Django's
# psycopg pool). Daphne runs each request in a thread of its own, and with
# persistent connections (CONN_MAX_AGE) every thread kept one: 86 held at four
# concurrent clients, and at eight PostgreSQL refused more. A request now
# borrows a connection and returns it when it ends; a worker process (one
# thread) returns its one connection after each task and gets it back, with its
# prepared statements, from its pool. Sizing: docs/architecture.md.
DATABASE_POOL_MAX_SIZE = env.integer(
    "DATABASE_POOL_MAX_SIZE",
    8,
    minimum=1,
    help="PostgreSQL: most connections one process (Daphne, a worker's pool "
    "process, beat) holds; requests beyond it wait for one.",
)
DATABASE_POOL_TIMEOUT = env.number(
    "DATABASE_POOL_TIMEOUT",
    20.0,
    minimum=0.1,
    help="PostgreSQL: seconds a request waits for a pooled connection before it fails.",
)


def _database(url: str) -> dict[str, Any]:
    try:
        config: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=60))
    except ValueError as exc:
        env.problems.append(("DATABASE_URL", f"cannot be parsed: {exc}"))
        config = dict(dj_database_url.parse(f"sqlite:///{BASE_DIR / 'db.sqlite3'}"))
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # Web, worker and beat share one file: WAL and immediate transactions turn
        # writer contention into short waits instead of "database is locked".
        # Connections persist like PostgreSQL's: opening one (pragmas, Django's
        # SQL functions) cost a step more than its writes.
        config["OPTIONS"] = {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
        # Tests that start a real worker need a file both processes can open.
        # One file per test process, so parallel test sessions never share it.
        config["TEST"] = {
            "NAME": str(BASE_DIR / ".run" / f"test-db-{os.getpid()}.sqlite3")
        }
    elif config["ENGINE"] == "django.db.backends.postgresql":
        options = config.setdefault("OPTIONS", {})
        # Pooled connections are returned, not kept (Django requires 0). No
        # minimum: a process
        # opens what its threads use at once (a worker process: one, which it
        # gets back task after task), and an idle one closes after 10 minutes.
        config["CONN_MAX_AGE"] = 0
        options["pool"] = {
            "min_size": 0,
            "max_size": DATABASE_POOL_MAX_SIZE,
            "timeout": DATABASE_POOL_TIMEOUT,
        }
    return config


DATABASES = {"default": _database(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
