"""Time arithmetic the dashboard's aggregates group and sort by, in each
database's own SQL. Django's Trunc and datetime subtraction are Python
functions on SQLite, called per row (and per comparison when sorting): 30 days
of runs took seconds. These are native on both backends."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import CharField, FloatField, Func
from django.db.models.sql.compiler import SQLCompiler

# The key of a bucket as both backends spell it: "2026-12-03T14:00:00".
_SQLITE_FORMAT = {"hour": "%Y-%m-%dT%H:00:00", "day": "%Y-%m-%dT00:00:00"}
_POSTGRES_FORMAT = {"hour": 'YYYY-MM-DD"T"HH24:00:00', "day": 'YYYY-MM-DD"T"00:00:00'}


def bucket_key(at: dt.datetime, step: str) -> str:
    return at.astimezone(dt.UTC).strftime(_SQLITE_FORMAT[step])


class BucketKey(Func):
    """The UTC hour or day a datetime falls in, as `bucket_key` text."""

    output_field = CharField()

    def __init__(self, expression: Any, step: str) -> None:
        if step not in _SQLITE_FORMAT:
            raise ValueError(f"unknown step {step!r}")
        self.step = step
        super().__init__(expression)

    def as_sqlite(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> Any:
        # Stored as UTC text "YYYY-MM-DD HH:MM:SS[.ffffff]": strftime reads it.
        # The format travels as a parameter (its % signs are no placeholders).
        sql, params = compiler.compile(self.source_expressions[0])
        return f"strftime(%s, {sql})", [_SQLITE_FORMAT[self.step], *params]

    def as_postgresql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> Any:
        fmt = _POSTGRES_FORMAT[self.step]
        return self.as_sql(
            compiler, connection,
            template=f"to_char(%(expressions)s AT TIME ZONE 'UTC', '{fmt}')",
            **extra,
        )  # fmt: skip


class SecondsBetween(Func):
    """`end - start` in seconds (a float)."""

    output_field = FloatField()
    arity = 2

    def as_sqlite(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> Any:
        template = "(julianday({end}) - julianday({start})) * 86400.0"
        return self._between(compiler, template, *self.source_expressions)

    def as_postgresql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> Any:
        template = "EXTRACT(EPOCH FROM ({end} - {start}))"
        return self._between(compiler, template, *self.source_expressions)

    def _between(
        self, compiler: SQLCompiler, template: str, start: Any, end: Any
    ) -> tuple[str, list[Any]]:
        start_sql, start_params = compiler.compile(start)
        end_sql, end_params = compiler.compile(end)
        sql = template.format(start=start_sql, end=end_sql)
        return sql, [*end_params, *start_params]
