"""recoverable_transaction: on PostgreSQL its commit does not wait for the WAL
flush (set in the round trip of its first statement); results are unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from controlplane.rows import row_update, rows_insert
from controlplane.transactions import recoverable_transaction
from runs.models import Agent
from tracing.models import SpanPayload


def synchronous_commit() -> str | None:
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_statements_in_it_return_their_own_results(tenant: Any) -> None:
    agent = Agent.objects.create(
        tenant=tenant, slug="a", name="a", model_adapter="scripted", model="m"
    )
    with recoverable_transaction():
        # The first statement shares its round trip with the setting.
        assert row_update(Agent, agent.pk, {"name": "b"}, where={"slug": "a"}) == 1
        assert row_update(Agent, agent.pk, {"name": "c"}, where={"slug": "x"}) == 0
        assert synchronous_commit() in (None, "off")
    with recoverable_transaction():  # an INSERT ... RETURNING first
        (pk,) = rows_insert(
            SpanPayload,
            ["tenant", "sha256", "size", "content", "created_at"],
            [[tenant.pk, "0" * 64, 2, "{}", timezone.now()]],
        )
    assert SpanPayload.objects.get(pk=pk).sha256 == "0" * 64
    assert Agent.objects.get(pk=agent.pk).name == "b"


@pytest.mark.django_db(transaction=True)
def test_it_is_durable_inside_a_durable_transaction_and_rolls_back(tenant: Any) -> None:
    agent = Agent.objects.create(
        tenant=tenant, slug="a", name="a", model_adapter="scripted", model="m"
    )
    with transaction.atomic():
        with recoverable_transaction():
            row_update(Agent, agent.pk, {"name": "b"})
        assert synchronous_commit() in (None, "on")
    with pytest.raises(RuntimeError), recoverable_transaction():
        row_update(Agent, agent.pk, {"name": "lost"})
        raise RuntimeError
    assert Agent.objects.get(pk=agent.pk).name == "b"
    assert synchronous_commit() in (None, "on")  # it was local to that transaction
