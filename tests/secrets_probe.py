"""Search everywhere a tenant secret's value could leak to for its plaintext.

Reusable: a test plants a secret, exercises a path that uses it (a model
endpoint's key, an MCP server's auth header, a credential the egress proxy
injects), feeds the probe what that path produced, and asserts it is clean:

    probe = SecretProbe(value)
    with captured_logs() as logs:
        ...                              # the path under test
    probe.response("GET /api/v1/runs/", response)
    probe.text("the run's sandbox env", env_dump)
    probe.logs(logs)
    probe.database()                     # every column of every table
    probe.assert_clean()

A value counts as found in any form text would carry it: as is, JSON-escaped,
base64-encoded, or inside a Django session's encoded data.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection

from controlplane.redaction import RedactingLogFilter


def forms_of(value: str) -> set[str]:
    """The texts that would carry `value`."""
    raw = value.encode()
    return {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        base64.b64encode(raw).decode().rstrip("="),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
    }


def _as_text(cell: Any) -> str:
    if cell is None:
        return ""
    if isinstance(cell, memoryview):
        cell = cell.tobytes()
    if isinstance(cell, bytes):
        return cell.decode("utf-8", "replace")
    if isinstance(cell, (dict, list)):
        return json.dumps(cell, ensure_ascii=False)
    return str(cell)


@dataclass
class SecretProbe:
    value: str
    found: list[str] = field(default_factory=list)
    searched: list[str] = field(default_factory=list)

    def text(self, where: str, text: str | bytes | None) -> None:
        """Record `where` if `text` carries the value."""
        body = _as_text(text)
        self.searched.append(where)
        if any(form in body for form in forms_of(self.value)):
            self.found.append(where)

    def response(self, where: str, response: Any) -> None:
        """A Django/DRF test response: its body and its headers."""
        headers = "\n".join(f"{k}: {v}" for k, v in response.items())
        self.text(f"{where} (headers)", headers)
        if getattr(response, "streaming", False):
            self.text(where, b"".join(response.streaming_content))
        else:
            self.text(where, response.content)

    def logs(self, logs: io.StringIO, where: str = "the logs") -> None:
        self.text(where, logs.getvalue())

    def database(self) -> None:
        """Every column of every row of every table (models, their m2m tables,
        Django's own), and the decoded data of every session."""
        tables = set(connection.introspection.table_names())
        models = apps.get_models(include_auto_created=True)
        modelled = {model._meta.db_table for model in models}
        # Every model's table exists and is searched (a table of a model the
        # test database lacks would be a migration missing, not a clean result).
        assert modelled <= tables, modelled - tables
        quote = connection.ops.quote_name
        with connection.cursor() as cursor:
            for table in sorted(tables):
                cursor.execute(f"SELECT * FROM {quote(table)}")  # noqa: S608 - names from introspection
                columns = [column[0] for column in cursor.description]
                hits = set()
                for row in cursor.fetchall():
                    for column, cell in zip(columns, row, strict=True):
                        body = _as_text(cell)
                        if any(form in body for form in forms_of(self.value)):
                            hits.add(column)
                self.searched.append(f"table {table}")
                self.found += [f"{table}.{column}" for column in sorted(hits)]
        store = SessionStore()
        with connection.cursor() as cursor:
            cursor.execute("SELECT session_key, session_data FROM django_session")
            for key, data in cursor.fetchall():
                self.text(f"session {key[:6]}…", json.dumps(store.decode(data)))

    def assert_clean(self) -> None:
        assert self.searched, "the probe searched nothing"
        assert not self.found, f"the secret's value was found in: {self.found}"


@contextlib.contextmanager
def captured_logs() -> Iterator[io.StringIO]:
    """What the configured log handlers write while the block runs, at every
    level: each handler with the redaction filter (settings.LOGGING's console)
    writes into the returned buffer instead of its stream."""
    buffer = io.StringIO()
    root = logging.getLogger()
    handlers = [
        handler
        for handler in root.handlers
        if isinstance(handler, logging.StreamHandler)
        and any(isinstance(f, RedactingLogFilter) for f in handler.filters)
    ]
    assert handlers, "no configured log handler redacts: settings.LOGGING changed?"
    streams = [handler.setStream(buffer) for handler in handlers]
    level = root.level
    root.setLevel(logging.DEBUG)
    try:
        yield buffer
    finally:
        root.setLevel(level)
        for handler, stream in zip(handlers, streams, strict=True):
            if stream is not None:
                handler.setStream(stream)
