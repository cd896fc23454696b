"""What the test's connection sent the database: on PostgreSQL read from libpq's
own protocol trace (so statements that bypass Django's cursors count too), on
SQLite from an execute wrapper (every execute is a call into the library)."""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

_PARSE = re.compile(r'^F\t\d+\tParse\t "(?P<name>[^"]*)" "(?P<sql>.*)" \d+( NNNN)*$')
_BIND = re.compile(r'^F\t\d+\tBind\t "[^"]*" "(?P<name>[^"]*)"')
_QUERY = re.compile(r'^F\t\d+\tQuery\t "(?P<sql>.*)"$')


@dataclass
class Wire:
    executed: list[str] = field(default_factory=list)  # each statement's SQL, in order
    prepared: list[str] = field(default_factory=list)  # SQL parsed as a named statement
    round_trips: int = 0  # waits for the server's answer

    def read_trace(self, lines: list[str]) -> None:
        named: dict[str, str] = {}  # statement name -> SQL
        unnamed = ""
        for line in lines:
            if parse := _PARSE.match(line):
                if parse["name"]:
                    named[parse["name"]] = parse["sql"]
                    self.prepared.append(parse["sql"])
                else:
                    unnamed = parse["sql"]
            elif bind := _BIND.match(line):
                name = bind["name"]
                self.executed.append(named.get(name, name) if name else unnamed)
            elif query := _QUERY.match(line):
                self.executed.append(query["sql"])
            elif "\tReadyForQuery" in line:
                self.round_trips += 1


@contextlib.contextmanager
def wire() -> Iterator[Wire]:
    found = Wire()
    if connection.vendor != "postgresql":

        def record(execute: Any, sql: str, *args: Any) -> Any:
            found.executed.append(sql)
            found.round_trips += 1
            return execute(sql, *args)

        with connection.execute_wrapper(record):
            yield found
        return
    from psycopg.pq import Trace

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+b") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
        try:
            yield found
        finally:
            pgconn.untrace()
            trace.seek(0)
            found.read_trace(trace.read().decode().splitlines())
