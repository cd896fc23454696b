"""A trigram index for trace search's text match, on PostgreSQL only (SQLite
scans the run's spans, as before).

The search filters a run's spans by `UPPER(name) LIKE`, `status =`,
`UPPER(status_message) LIKE` and `UPPER(attributes::text) LIKE` (Django's
`icontains`, tracing/tree.py): one GIN index over the four expressions lets
PostgreSQL answer each arm from the index and OR them, instead of reading
every span of the run. A rare value in a 20,000-span run: the query 30-40 ms
-> 0.3 ms; the whole search (ordering, paths) 60-70 ms -> 5-15 ms.

Built CONCURRENTLY (so outside a transaction): a deployment keeps writing spans
while it builds. pg_trgm is a trusted extension (PostgreSQL 13+): the database
owner may create it."""

from typing import Any

from django.db import migrations

INDEX = "tracing_span_text_trgm"


def create(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    table = apps.get_model("tracing", "Span")._meta.db_table
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    # The expressions are the ones Django writes for the lookups, to the cast:
    # any other spelling and the planner cannot use the index.
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} ON {table} USING gin ("
        "(UPPER(name::text)) gin_trgm_ops, status gin_trgm_ops, "
        "(UPPER(status_message)) gin_trgm_ops, "
        "(UPPER(attributes::text)) gin_trgm_ops)"
    )


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tracing", "0004_span_log_message"),
    ]

    operations = [migrations.RunPython(create, drop)]
