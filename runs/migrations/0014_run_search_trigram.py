"""Trigram indexes for the runs list's text search, on PostgreSQL only
(runs/search_indexes.py). pg_trgm is a trusted extension (PostgreSQL 13+): the
database's owner may create it without being a superuser."""

from __future__ import annotations

from typing import Any

from django.db import migrations

from runs.search_indexes import RUN_SEARCH_INDEXES


def create_indexes(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    for statement in RUN_SEARCH_INDEXES.values():
        schema_editor.execute(statement)


def drop_indexes(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in RUN_SEARCH_INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("runs", "0013_external_gate")]

    operations = [
        migrations.RunPython(create_indexes, drop_indexes),
    ]
