"""Plain INSERT and UPDATE statements for a step's hot path.

A step writes a handful of rows (its record, tool calls, span rows, events);
building each statement through the ORM (query objects, compilers) cost more
than running it (measured with `bench.bench_steps`). These helpers take the
column names and value conversions from the model's own fields, so the SQL and
parameters are what the ORM would send, on SQLite and PostgreSQL alike. Models
written here have no signals and no save() overrides.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.models import Model
from psycopg.types.json import Json, Jsonb

__all__ = [
    "ColumnOf",
    "EncodedJSON",
    "FirstStatement",
    "InstancesInsert",
    "OrNull",
    "Select",
    "Statement",
    "instances_insert",
    "instances_insert_prepare",
    "instances_select",
    "instances_where",
    "row_update",
    "row_update_statement",
    "rows_insert",
    "rows_insert_statement",
    "statements_run",
]


def _db() -> Any:
    """This thread's connection. Django's `connection` proxy looks it up again on
    every attribute access, and converting a step's values accesses it hundreds
    of times."""
    return connections[DEFAULT_DB_ALIAS]


def _fields(model: type[Model], names: Sequence[str]) -> list[Any]:
    return [model._meta.get_field(name) for name in names]


# Compiled SELECTs by shape (vendor, model, filtered fields and how each matches,
# order, limit, loaded fields): the SQL text, the fields taking parameters, the
# attribute names and each column's value converters.
_Select = tuple[str, list[Any], list[str], list[tuple[Any, list[Any]]]]
_selects: dict[tuple[Any, ...], _Select] = {}


def _select(
    model: type[Model],
    names: tuple[str, ...],
    nulls: tuple[bool | str | tuple[type[Model], str], ...],
    order_by: tuple[str, ...],
    limit: int,
    only: tuple[str, ...],
) -> _Select:
    # nulls[i]: True (IS NULL), False (= %s), "or_null" (= %s OR IS NULL) or
    # (model, field) of a `ColumnOf` (= that column of the row whose key is %s)
    db = _db()
    key = (db.vendor, model, names, nulls, order_by, limit, only)
    found = _selects.get(key)
    if found is not None:
        return found
    meta = model._meta
    quote = db.ops.quote_name
    table = meta.db_table
    loaded = [
        field
        for field in meta.concrete_fields
        if not only or field.primary_key or field.name in only
    ]
    columns: list[tuple[Any, list[Any]]] = []
    for field in loaded:
        field = cast(Any, field)
        column = field.get_col(table)
        converters = db.ops.get_db_converters(column)
        columns.append((column, [*converters, *field.get_db_converters(db)]))
    fields = _fields(model, names)
    where = " AND ".join(
        f"{quote(field.column)} IS NULL"
        if null is True
        else f"({quote(field.column)} = %s OR {quote(field.column)} IS NULL)"
        if null == "or_null"
        else f"{quote(field.column)} = {_column_of(*null)}"
        if isinstance(null, tuple)
        else f"{quote(field.column)} = %s"
        for field, null in zip(fields, nulls, strict=True)
    )
    filtered = [
        null[0]._meta.pk if isinstance(null, tuple) else field
        for field, null in zip(fields, nulls, strict=True)
        if null is not True
    ]
    order = ", ".join(
        quote(field.column) + (" DESC" if name.startswith("-") else "")
        for field, name in zip(
            _fields(model, [name.lstrip("-") for name in order_by]),
            order_by,
            strict=True,
        )
    )
    sql = (
        f"SELECT {', '.join(quote(f.column) for f in loaded)} "
        f"FROM {quote(table)}"
        + (f" WHERE {where}" if where else "")
        + (f" ORDER BY {order}" if order else "")
        + (f" LIMIT {int(limit)}" if limit else "")
    )
    found = (sql, filtered, [f.attname for f in loaded], columns)
    _selects[key] = found
    return found


class OrNull(NamedTuple):
    """In `instances_where`: the field equals this value or is NULL."""

    value: Any


class ColumnOf(NamedTuple):
    """In `instances_where`: the field equals `field` of the `model` row whose
    key is `pk`, read by a subquery (so the two reads are one)."""

    model: type[Model]
    field: str
    pk: Any


def _column_of(model: type[Model], name: str) -> str:
    quote = _db().ops.quote_name
    column = cast(Any, model._meta.get_field(name)).column
    return (
        f"(SELECT {quote(column)} FROM {quote(model._meta.db_table)} "
        f"WHERE {quote(cast(Any, model._meta.pk).column)} = %s)"
    )


def instances_where(
    model: type[Model],
    equal: Mapping[str, Any],
    *,
    order_by: Sequence[str] = (),
    limit: int = 0,
    only: Sequence[str] = (),
) -> list[Any]:
    """Instances whose fields equal `equal`, as `filter(**equal)` would return
    them (values converted by the fields, as the ORM does), by one SQL text
    compiled once per shape. `order_by`: field names, `-` for descending; a None
    value matches NULL, `OrNull(value)` the value or NULL, `ColumnOf(...)` a
    column of another row; `only`: the fields to load (and the key), as
    `.only()`."""
    return instances_select(
        model, equal, order_by=order_by, limit=limit, only=only
    ).run()


def instances_select(
    model: type[Model],
    equal: Mapping[str, Any],
    *,
    order_by: Sequence[str] = (),
    limit: int = 0,
    only: Sequence[str] = (),
) -> Select:
    """`instances_where`'s query, to run later or with others (`statements_run`)."""
    nulls = tuple(
        "or_null"
        if isinstance(value, OrNull)
        else (value.model, value.field)
        if isinstance(value, ColumnOf)
        else value is None
        for value in equal.values()
    )
    sql, filtered, attnames, columns = _select(
        model, tuple(equal), nulls, tuple(order_by), limit, tuple(only)
    )
    matched = [
        value.value
        if isinstance(value, OrNull)
        else value.pk
        if isinstance(value, ColumnOf)
        else value
        for value in equal.values()
        if value is not None
    ]
    db = _db()
    params = [
        field.get_db_prep_value(value, db)
        for field, value in zip(filtered, matched, strict=True)
    ]
    return Select(sql, params, model, attnames, columns)


class Select(NamedTuple):
    """A SELECT of model instances (`instances_select`)."""

    sql: str
    params: list[Any]
    model: type[Model]
    attnames: list[str]
    columns: list[tuple[Any, list[Any]]]  # each column's value converters

    def run(self) -> list[Any]:
        return list(statements_run([self])[0])

    def result(self, cursor: Any) -> list[Any]:
        """The instances in the cursor's current result."""
        db = _db()
        found = []
        for row in cursor.fetchall():
            values = []
            for value, (column, converters) in zip(row, self.columns, strict=True):
                for convert in converters:
                    value = convert(value, column, db)
                values.append(value)
            found.append(self.model.from_db(db.alias, self.attnames, values))
        return found


def rows_insert(
    model: type[Model],
    names: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    returning: bool = True,
    ignore_conflicts: bool = False,
) -> list[Any]:
    """Insert `rows` (values in the order of `names`) in one statement; return
    their primary keys in insertion order (as bulk_create relies on too)."""
    if not rows:
        return []
    statement = rows_insert_statement(
        model, names, rows, returning=returning, ignore_conflicts=ignore_conflicts
    )
    (result,) = statements_run([statement])  # the keys, or a row count
    return result if returning else []


def rows_insert_statement(
    model: type[Model],
    names: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    returning: bool = True,
    ignore_conflicts: bool = False,
) -> Statement:
    """`rows_insert`'s statement, its values converted now (`rows` not empty);
    `returning`: it returns the primary keys (its result in `statements_run`)."""
    db = _db()
    fields = _fields(model, names)
    quote = db.ops.quote_name
    columns = ", ".join(quote(field.column) for field in fields)
    one = "(" + ", ".join(["%s"] * len(fields)) + ")"
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({columns}) "
        f"VALUES {', '.join([one] * len(rows))}"
    )
    if ignore_conflicts:
        sql += " ON CONFLICT DO NOTHING"
    if returning:
        key: Any = model._meta.pk
        sql += f" RETURNING {quote(key.column)}"
    params = [
        _db_value(db, field, value)
        for row in rows
        for field, value in zip(fields, row, strict=True)
    ]
    return Statement(sql, params, returns=returning)


class Statement(NamedTuple):
    """SQL with its parameters already converted by the fields: built before a
    transaction, so that on SQLite the one write lock covers only running it.
    `returns`: it returns keys (INSERT ... RETURNING)."""

    sql: str
    params: list[Any]
    returns: bool = False

    def run(self) -> int:
        """Execute; the number of rows changed."""
        (result,) = statements_run([self])
        return len(result) if self.returns else int(result)

    def result(self, cursor: Any) -> Any:
        """The keys it returned, or else the number of rows it changed."""
        if self.returns:
            return [found[0] for found in cursor.fetchall()]
        return int(cursor.rowcount)


def statements_run(statements: Sequence[Statement | Select]) -> list[Any]:
    """Run the statements in order; each one's result: the rows a write changed,
    the keys an insert returned, the instances a select found. On PostgreSQL
    they go in one round trip, as prepared statements (`_pipelined`)."""
    if not statements:
        return []
    db = _db()
    if db.vendor == "postgresql":
        return _pipelined(db, statements)
    return _on_sqlite(db, statements)


def _on_sqlite(db: Any, statements: Sequence[Statement | Select]) -> list[Any]:
    """On the sqlite3 connection itself: Django's cursor wrappers (thread checks,
    execute wrappers, a regular expression rewriting each `%s`) cost about as
    much Python per statement as SQLite takes to run a step's small writes, and
    inside a write transaction every other worker waits for it. A write outside
    a transaction still queues for the writer lock (`controlplane.db`)."""
    db.ensure_connection()
    db.validate_no_broken_transaction()
    cursor = db.connection.cursor()
    results = []
    try:
        with db.wrap_database_errors:
            for statement in statements:
                with db.writer_queued(statement.sql):
                    cursor.execute(_qmarked(statement.sql), statement.params)
                    results.append(statement.result(cursor))
    finally:
        cursor.close()
    return results


@functools.lru_cache(maxsize=1024)
def _qmarked(sql: str) -> str:
    """The SQL with sqlite3's `?` placeholders (the SQL built here has no other
    `%`)."""
    return sql.replace("%s", "?")


def _pipelined(db: Any, statements: Sequence[Statement | Select]) -> list[Any]:
    """psycopg's pipeline mode sends the statements without waiting for each
    result, and its server-side binding lets each be a prepared statement: a
    step's statements are the same few shapes every time, which the server
    would otherwise parse and plan again on every step (40% of its CPU here).
    Django's own cursors bind client-side and never prepare, so they are
    bypassed, and with them its execute wrappers: a `FirstStatement` waiting to
    go is sent first."""
    db.ensure_connection()
    db.validate_no_broken_transaction()
    first = [
        wrapper for wrapper in db.execute_wrappers
        if isinstance(wrapper, FirstStatement) and wrapper.take()
    ]  # fmt: skip
    raw = db.connection
    firsts = [psycopg.RawCursor(raw) for _ in first]
    cursors = [psycopg.RawCursor(raw) for _ in statements]
    try:
        with db.wrap_database_errors:
            # A lone statement is one round trip either way, and pipeline mode
            # costs it more client CPU (0.13 ms against 0.08).
            with raw.pipeline() if first or len(statements) > 1 else nullcontext():
                for waiting, cursor in zip(first, firsts, strict=True):
                    cursor.execute(waiting.sql.encode(), prepare=waiting.prepare)
                for statement, cursor in zip(statements, cursors, strict=True):
                    sql = _numbered(statement.sql)
                    cursor.execute(sql, statement.params, prepare=True)
            return [
                statement.result(cursor)
                for statement, cursor in zip(statements, cursors, strict=True)
            ]
    finally:
        for cursor in [*firsts, *cursors]:
            cursor.close()


@functools.lru_cache(maxsize=1024)
def _numbered(sql: str) -> bytes:
    """The SQL with PostgreSQL's own placeholders (`$1`, `$2`, …) for a raw
    cursor: psycopg would otherwise find the `%s` with a regular expression on
    every execute (it caches that only for texts under 4 KB and 50 parameters,
    and a step's multi-row inserts are larger). The SQL built here has no other
    `%`."""
    parts = sql.split("%s")
    if any("%" in part for part in parts):
        raise ValueError(f"unexpected % in {sql[:80]!r}")
    numbered = [parts[0]]
    for number, part in enumerate(parts[1:], start=1):
        numbered.append(f"${number}{part}")
    return "".join(numbered).encode()


class FirstStatement:
    """An execute wrapper that sends `sql` in the same round trip as the next
    statement, and hands on that statement's result: Django's psycopg cursors
    bind client-side, so several statements go in one execute, and
    `statements_run` sends it first in its pipeline. A transaction that runs
    none commits durably. `prepare`: the text is the same every time (a
    setting, not a savepoint's new name), so it goes as a prepared statement."""

    def __init__(self, sql: str, *, prepare: bool = False) -> None:
        self.sql = sql
        self.prepare = prepare
        self.sent = False

    def take(self) -> bool:
        """Whether it has yet to go (it is then taken as sent)."""
        if self.sent:
            return False
        self.sent = True
        return True

    def __call__(
        self,
        execute: Any,
        query: str,
        params: Any,
        many: bool,
        context: Any,
    ) -> Any:
        if self.sent or many:
            return execute(query, params, many, context)
        self.sent = True
        result = execute(f"{self.sql}; {query}", params, many, context)
        context["cursor"].nextset()  # the result of `query`, not of `sql`
        return result


def row_update_statement(
    model: type[Model],
    pk: Any,
    values: Mapping[str, Any],
    *,
    where: Mapping[str, Any] | None = None,
    where_not_in: Mapping[str, Collection[Any]] | None = None,
) -> Statement:
    """UPDATE one row by primary key, the `where` equalities and the fields not in
    `where_not_in`'s values (fields that are never NULL)."""
    db = _db()
    fields = _fields(model, list(values))
    quote = db.ops.quote_name
    sets = ", ".join(f"{quote(field.column)} = %s" for field in fields)
    params = [
        _db_value(db, field, value)
        for field, value in zip(fields, values.values(), strict=True)
    ]
    key: Any = model._meta.pk
    conditions = [f"{quote(key.column)} = %s"]
    params.append(key.get_db_prep_value(pk, db))
    for field, value in zip(_fields(model, list(where or {})), (where or {}).values(),
                            strict=True):  # fmt: skip
        conditions.append(f"{quote(field.column)} = %s")
        params.append(field.get_db_prep_value(value, db))
    for name, excluded in (where_not_in or {}).items():
        if not excluded:
            continue
        field = cast(Any, model._meta.get_field(name))
        conditions.append(
            f"{quote(field.column)} NOT IN ({', '.join(['%s'] * len(excluded))})"
        )
        params.extend(field.get_db_prep_value(value, db) for value in excluded)
    sql = (
        f"UPDATE {quote(model._meta.db_table)} SET {sets} "
        f"WHERE {' AND '.join(conditions)}"
    )
    return Statement(sql, params)


class EncodedJSON(dict[str, Any]):
    """A JSON object and its encoding, made where parts of the encoding were at
    hand (`EngineState.to_json`): written here, a JSON field stores `text` as is."""

    def __init__(self, value: Mapping[str, Any], text: str) -> None:
        super().__init__(value)
        self.text = text


# Field classes whose conversion returns a value of this exact type unchanged:
# a step converts about 140 values, most of them plain strings and numbers.
# (On PostgreSQL, Django wraps integers in psycopg's sized types.)
_PLAIN_ANYWHERE: dict[type, type] = {
    models.CharField: str,
    models.TextField: str,
    models.BooleanField: bool,
}
_PLAIN: dict[str, dict[type, type]] = {
    "postgresql": _PLAIN_ANYWHERE,
    "sqlite": {
        **_PLAIN_ANYWHERE,
        models.IntegerField: int,
        models.BigIntegerField: int,
        models.PositiveIntegerField: int,
        models.PositiveSmallIntegerField: int,
        models.SmallIntegerField: int,
    },
}


def _db_value(db: Any, field: Any, value: Any) -> Any:
    if type(value) is _PLAIN.get(db.vendor, {}).get(type(field)):
        return value
    if isinstance(value, EncodedJSON):
        if db.vendor == "postgresql":
            return Jsonb(value.text, dumps=_as_is)
        return value.text
    return _encoded_now(field.get_db_prep_save(value, db))


def _encoded_now(value: Any) -> Any:
    """psycopg's JSON wrappers encode when the statement runs; a prepared
    statement holds the value as it was when prepared."""
    if isinstance(value, Json | Jsonb):
        dumps = value.dumps or json.dumps
        return type(value)(dumps(value.obj), dumps=_as_is)
    return value


def _as_is(text: Any) -> Any:
    return text


def row_update(
    model: type[Model],
    pk: Any,
    values: Mapping[str, Any],
    *,
    where: Mapping[str, Any] | None = None,
) -> int:
    """UPDATE one row by primary key (and the `where` equalities); rows changed."""
    return row_update_statement(model, pk, values, where=where).run()


def instances_insert(instances: Sequence[Model]) -> None:
    """Insert unsaved instances of one model in one statement, as `create()` would
    (field defaults and auto_now_add applied; the primary key set on each)."""
    instances_insert_prepare(instances).execute()


@dataclass(frozen=True)
class InstancesInsert:
    """`instances_insert`, prepared: its statement built and values converted
    before the transaction that runs it. A `late` field is read from the
    instances when it runs (a key that an insert in the transaction makes)."""

    instances: Sequence[Model]
    statement: Statement
    generated: bool  # an auto-increment key comes back
    late: list[tuple[int, Any]]  # (position in a row, field)

    def execute(self) -> None:
        for result in statements_run(self.ready()):
            self.saved(result if self.generated else ())

    def ready(self) -> list[Statement]:
        """Its statement (none if there is nothing to insert), the late fields
        read now: to run with others (`statements_run`), then call `saved`."""
        if not self.instances:
            return []
        db = _db()
        params = self.statement.params
        width = len(params) // len(self.instances)  # values per row
        for index, obj in enumerate(self.instances):
            for position, field in self.late:
                value = getattr(obj, field.attname)
                params[index * width + position] = field.get_db_prep_save(value, db)
        return [self.statement]

    def saved(self, pks: Sequence[Any] = ()) -> None:
        """Mark the instances stored, with the keys the insert generated."""
        if self.generated:
            key: Any = self.instances[0]._meta.pk
            for obj, pk in zip(self.instances, pks, strict=True):
                setattr(obj, key.attname, pk)
        alias = _db().alias
        for obj in self.instances:
            obj._state.adding = False
            obj._state.db = alias


def instances_insert_prepare(
    instances: Sequence[Model], *, late: Sequence[str] = ()
) -> InstancesInsert:
    """`instances_insert`'s work that needs no database; `late`: field names whose
    values are read when it runs."""
    if not instances:
        return InstancesInsert(instances, Statement("", []), False, [])
    meta = instances[0]._meta
    key: Any = meta.pk
    generated = key.db_returning
    fields = [f for f in meta.concrete_fields if not (generated and f is key)]
    rows = [[field.pre_save(obj, True) for field in fields] for obj in instances]
    statement = rows_insert_statement(
        type(instances[0]), [f.name for f in fields], rows, returning=generated
    )
    positions = [
        (index, field) for index, field in enumerate(fields) if field.name in late
    ]
    return InstancesInsert(instances, statement, generated, positions)
