"""Lookups by run (or tenant) on the tables a step writes are served by an index
even though their foreign keys have none of their own: the unique or composite
index that starts with the column serves them (migrations runs/0003, tracing/0002)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.models import QuerySet

from runs.models import Step, ToolCall
from tracing.models import RunEvent, Span, SpanPayload

RUN = "00000000-0000-0000-0000-000000000001"


def plan(queryset: QuerySet[Any]) -> str:
    """The database's plan for the query, with sequential scans ruled out where
    the planner allows it (PostgreSQL picks one on a small table otherwise)."""
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute(f"EXPLAIN {sql}", params)
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        return "\n".join(str(row[-1]) for row in cursor.fetchall())


def uses_index(text: str) -> bool:
    if connection.vendor == "postgresql":
        return "Index" in text and "Seq Scan" not in text
    return "USING INDEX" in text or "USING COVERING INDEX" in text


@pytest.mark.django_db
@pytest.mark.parametrize(
    "queryset",
    [
        lambda: Step.objects.filter(run_id=RUN).order_by("-index")[:1],
        lambda: ToolCall.objects.filter(run_id=RUN),
        lambda: Span.objects.filter(run_id=RUN),
        lambda: Span.objects.filter(run_id=RUN, parent_span_id=""),
        lambda: RunEvent.objects.filter(run_id=RUN, seq__gt=3),
        lambda: SpanPayload.objects.filter(tenant_id=RUN, sha256__in=["a", "b"]),
    ],
    ids=["step", "tool_call", "span", "span_children", "run_event", "payload"],
)
def test_lookups_by_run_or_tenant_use_an_index(queryset: Any) -> None:
    text = plan(queryset())
    assert uses_index(text), text


@pytest.mark.django_db
def test_the_covered_foreign_keys_have_no_index_of_their_own() -> None:
    with connection.cursor() as cursor:
        for model, column in [
            (Step, "run_id"),
            (ToolCall, "run_id"),
            (Span, "run_id"),
            (Span, "parent_span_id"),
            (RunEvent, "run_id"),
            (SpanPayload, "tenant_id"),
        ]:
            table = model._meta.db_table
            constraints = connection.introspection.get_constraints(cursor, table)
            alone = [
                name
                for name, info in constraints.items()
                if info["index"] and info["columns"] == [column]
            ]
            assert alone == [], (table, alone)
