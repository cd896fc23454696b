"""recoverable_transaction and recoverable_write: on PostgreSQL their commit does
not wait for the WAL flush (set in the round trip of the first statement);
results are unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from controlplane.rows import (
    instances_select,
    row_update,
    row_update_statement,
    rows_insert,
)
from controlplane.transactions import (
    recoverable_transaction,
    recoverable_write,
    sub_transaction,
)
from runs.models import Agent
from tests.wire import wire
from tracing.models import SpanPayload


@pytest.fixture
def agent(tenant: Any) -> Agent:
    return Agent.objects.create(
        tenant=tenant, slug="a", name="a", model_adapter="scripted", model="m"
    )


def synchronous_commit() -> str | None:
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_statements_in_it_return_their_own_results(tenant: Any, agent: Agent) -> None:
    with wire() as sent, recoverable_transaction():
        # The first statement shares its round trip with the setting.
        assert row_update(Agent, agent.pk, {"name": "b"}, where={"slug": "a"}) == 1
        assert row_update(Agent, agent.pk, {"name": "c"}, where={"slug": "x"}) == 0
        assert synchronous_commit() in (None, "off")
    if connection.vendor == "postgresql":  # the same text each time: prepared
        assert "synchronous_commit" in sent.prepared[0]
    with recoverable_transaction():  # an INSERT ... RETURNING first
        (pk,) = rows_insert(
            SpanPayload,
            ["tenant", "sha256", "size", "content", "created_at"],
            [[tenant.pk, "0" * 64, 2, "{}", timezone.now()]],
        )
    assert SpanPayload.objects.get(pk=pk).sha256 == "0" * 64
    assert Agent.objects.get(pk=agent.pk).name == "b"


@pytest.mark.django_db(transaction=True)
def test_it_is_durable_inside_a_durable_transaction_and_rolls_back(
    agent: Agent,
) -> None:
    with transaction.atomic():
        with recoverable_transaction():
            row_update(Agent, agent.pk, {"name": "b"})
        assert synchronous_commit() in (None, "on")
    with pytest.raises(RuntimeError), recoverable_transaction():
        row_update(Agent, agent.pk, {"name": "lost"})
        raise RuntimeError
    assert Agent.objects.get(pk=agent.pk).name == "b"
    assert synchronous_commit() in (None, "on")  # it was local to that transaction


@pytest.mark.django_db(transaction=True)
def test_a_recoverable_write_is_its_own_transaction_in_one_round_trip(
    agent: Agent,
) -> None:
    with wire() as sent:
        won, found = recoverable_write(
            row_update_statement(Agent, agent.pk, {"name": "b"}, where={"slug": "a"}),
            instances_select(Agent, {"id": agent.pk}),
        )
        (lost,) = recoverable_write(
            row_update_statement(Agent, agent.pk, {"name": "c"}, where={"slug": "x"})
        )
    assert (won, lost) == (1, 0)
    assert [a.name for a in found] == ["b"]  # the read comes after the write
    assert Agent.objects.get(pk=agent.pk).name == "b"  # committed, not "c"
    # No BEGIN or COMMIT of its own; on PostgreSQL, the read in the same round trip.
    assert not [sql for sql in sent.executed if sql in ("BEGIN", "COMMIT")]
    assert sent.round_trips == (2 if connection.vendor == "postgresql" else 3)
    if connection.vendor == "postgresql":
        assert "synchronous_commit" in sent.executed[0]
        assert sent.executed[1].startswith('UPDATE "runs_agent"')
    assert not connection.in_atomic_block
    assert synchronous_commit() in (None, "on")  # local to its own transaction


@pytest.mark.django_db(transaction=True)
def test_a_recoverable_write_inside_a_transaction_rolls_back_with_it(
    agent: Agent,
) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        assert recoverable_write(row_update_statement(Agent, agent.pk, {"name": "b"}))[
            0
        ]
        raise RuntimeError
    assert Agent.objects.get(pk=agent.pk).name == "a"


def payload_row(tenant: Any, digest: str) -> list[Any]:
    return [tenant.pk, digest, 2, "{}", timezone.now()]


PAYLOAD_COLUMNS = ["tenant", "sha256", "size", "content", "created_at"]


@pytest.mark.django_db(transaction=True)
def test_a_failed_sub_transaction_loses_only_its_own_writes_and_hooks(
    tenant: Any, agent: Agent
) -> None:
    """The span store inside a step's closing write: a failure there must not
    cost the step its checkpoint, nor broadcast events that were rolled back."""
    ran: list[str] = []
    with wire() as sent, transaction.atomic():
        row_update(Agent, agent.pk, {"name": "b"})
        with pytest.raises(IntegrityError), sub_transaction():
            rows_insert(SpanPayload, PAYLOAD_COLUMNS, [payload_row(tenant, "1" * 64)])
            transaction.on_commit(lambda: ran.append("inside"))
            # The same (tenant, sha256) again, without ignoring the conflict.
            rows_insert(SpanPayload, PAYLOAD_COLUMNS, [payload_row(tenant, "1" * 64)])
        transaction.on_commit(lambda: ran.append("after"))
        with sub_transaction():  # the transaction goes on, and so can another
            rows_insert(SpanPayload, PAYLOAD_COLUMNS, [payload_row(tenant, "2" * 64)])
    assert Agent.objects.get(pk=agent.pk).name == "b"
    assert list(SpanPayload.objects.values_list("sha256", flat=True)) == ["2" * 64]
    assert ran == ["after"]
    if connection.vendor == "postgresql":
        # Each savepoint went with its first statement; none was released.
        assert not [sql for sql in sent.executed if sql.startswith("RELEASE")]
        # (psycopg forgets its prepared statements after a rollback: DEALLOCATE.)
        assert [
            sql.split(" ")[0] for sql in sent.executed if sql != "DEALLOCATE ALL"
        ] == [
            "BEGIN", "UPDATE", "SAVEPOINT", "INSERT", "INSERT", "ROLLBACK",
            "SAVEPOINT", "INSERT", "COMMIT",
        ]  # fmt: skip
        # Round trips: BEGIN, the update (prepared first: a lone statement is not
        # pipelined), the savepoint with the first insert, the second insert, the
        # rollback, DEALLOCATE, the savepoint with the insert, COMMIT.
        assert sent.round_trips == 9


@pytest.mark.django_db(transaction=True)
def test_a_sub_transaction_outside_a_transaction_is_one_of_its_own(
    tenant: Any,
) -> None:
    with pytest.raises(IntegrityError), sub_transaction():
        rows_insert(SpanPayload, PAYLOAD_COLUMNS, [payload_row(tenant, "1" * 64)])
        rows_insert(SpanPayload, PAYLOAD_COLUMNS, [payload_row(tenant, "1" * 64)])
    assert not SpanPayload.objects.exists()
    assert not connection.in_atomic_block
