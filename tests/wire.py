"""What the test's connection sent the database, read from the library's own
trace (so statements that bypass Django's cursors count too): libpq's protocol
trace on PostgreSQL, sqlite3's trace callback on SQLite (every statement is a
call into the library, its parameters shown inline)."""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

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
    connection.ensure_connection()
    if connection.vendor != "postgresql":

        def record(sql: str) -> None:
            found.executed.append(sql)
            found.round_trips += 1

        connection.connection.set_trace_callback(record)
        try:
            yield found
        finally:
            connection.connection.set_trace_callback(None)
        return
    from psycopg.pq import Trace

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
