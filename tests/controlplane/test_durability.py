"""recoverable_transaction: on PostgreSQL its commit does not wait for the WAL
flush, for that transaction only; results and rollbacks are unchanged. Inside a
transaction it is a savepoint (the span store's failure loses only the spans)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from controlplane.durability import recoverable_transaction
from runs.models import Agent
from tracing.models import SpanPayload


@pytest.fixture
def agent(tenant: Any) -> Agent:
    return Agent.objects.create(tenant=tenant, slug="a", name="a")


def synchronous_commit() -> str | None:
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


def payload(tenant: Any, sha256: str) -> SpanPayload:
    return SpanPayload(tenant=tenant, sha256=sha256, size=2, content="{}")


@pytest.mark.django_db(transaction=True)
def test_it_commits_without_waiting_for_the_flush_only_itself(agent: Agent) -> None:
    with recoverable_transaction():
        assert Agent.objects.filter(pk=agent.pk, slug="a").update(name="b") == 1
        assert synchronous_commit() in (None, "off")
    assert Agent.objects.get(pk=agent.pk).name == "b"
    assert synchronous_commit() in (None, "on")  # it was local to that transaction


@pytest.mark.django_db(transaction=True)
def test_it_is_durable_inside_a_durable_transaction_and_rolls_back(
    agent: Agent,
) -> None:
    with transaction.atomic():
        with recoverable_transaction():
            Agent.objects.filter(pk=agent.pk).update(name="b")
        assert synchronous_commit() in (None, "on")
    with pytest.raises(RuntimeError), recoverable_transaction():
        Agent.objects.filter(pk=agent.pk).update(name="lost")
        raise RuntimeError
    assert Agent.objects.get(pk=agent.pk).name == "b"


@pytest.mark.django_db(transaction=True)
def test_a_failed_inner_one_loses_only_its_own_writes_and_hooks(
    tenant: Any, agent: Agent
) -> None:
    """The span store inside a step's closing write: a failure there must not
    cost the step its checkpoint, nor broadcast events that were rolled back."""
    ran: list[str] = []
    with transaction.atomic():
        Agent.objects.filter(pk=agent.pk).update(name="b")
        with pytest.raises(IntegrityError), recoverable_transaction():
            payload(tenant, "1" * 64).save()
            transaction.on_commit(lambda: ran.append("inside"))
            payload(tenant, "1" * 64).save()  # the same (tenant, sha256) again
        transaction.on_commit(lambda: ran.append("after"))
        with recoverable_transaction():  # the transaction goes on, and so can another
            payload(tenant, "2" * 64).save()
    assert Agent.objects.get(pk=agent.pk).name == "b"
    assert list(SpanPayload.objects.values_list("sha256", flat=True)) == ["2" * 64]
    assert ran == ["after"]
