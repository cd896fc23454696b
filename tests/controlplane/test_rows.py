"""The hot path's plain SQL reads and writes return and store what the ORM would."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from django.db.models import Q
from django.forms.models import model_to_dict

from budgets.models import ModelPriceEntry
from controlplane.rows import (
    ColumnOf,
    EncodedJSON,
    OrNull,
    instances_insert_prepare,
    instances_select,
    instances_where,
    row_update,
    row_update_statement,
    rows_insert_statement,
    statements_run,
)
from runs.models import Agent, Run, Step, ToolCall
from runs.services import run_start
from tests.wire import wire


@pytest.fixture
def run(tenant: Any) -> Run:
    Agent.objects.create(
        tenant=tenant, slug="a", name="a", model_adapter="scripted", model="m",
        tool_names=["echo"], script=[{"text": "hi"}],
    )  # fmt: skip
    return run_start(tenant=tenant, agent_slug="a", input="go", started_by=None)


def fields_of(instance: Any) -> dict[str, Any]:
    return {
        f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields
    }


def test_an_instance_read_by_plain_sql_equals_the_orms(run: Run) -> None:
    found = instances_where(Run, {"id": run.id})
    assert len(found) == 1
    # Every type converted as the ORM does: UUIDs, JSON, datetimes, decimals.
    assert fields_of(found[0]) == fields_of(Run.objects.get(id=run.id))
    assert found[0]._state.adding is False
    assert instances_where(Run, {"id": run.agent_id}) == []


def test_only_loads_the_named_fields_and_the_key(run: Run) -> None:
    Run.objects.filter(id=run.id).update(cancel_requested=True)
    (found,) = instances_where(Run, {"id": run.id}, only=["cancel_requested"])
    assert found.cancel_requested is True and found.id == run.id
    assert found.get_deferred_fields() >= {"engine_state", "input"}


def test_none_matches_null_and_or_null_matches_either(
    tenant: Any, other_tenant: Any
) -> None:
    shared = ModelPriceEntry.objects.create(
        tenant=None, model="m1", input_per_million=Decimal("1.5"),
        output_per_million=Decimal("2"), cached_input_per_million=Decimal("0.5"),
    )  # fmt: skip
    own = ModelPriceEntry.objects.create(
        tenant=tenant, model="m1", input_per_million=Decimal("3"),
        output_per_million=Decimal("4"), cached_input_per_million=Decimal("1"),
    )  # fmt: skip
    ModelPriceEntry.objects.create(
        tenant=other_tenant, model="m1", input_per_million=Decimal("9"),
        output_per_million=Decimal("9"), cached_input_per_million=Decimal("9"),
    )  # fmt: skip
    assert [r.pk for r in instances_where(ModelPriceEntry, {"tenant": None})] == [
        shared.pk
    ]
    either = instances_where(
        ModelPriceEntry, {"tenant": OrNull(tenant.pk), "model": "m1"}, order_by=["-id"]
    )
    expected = ModelPriceEntry.objects.filter(
        Q(tenant=tenant) | Q(tenant__isnull=True), model="m1"
    ).order_by("-id")
    assert [model_to_dict(r) for r in either] == [model_to_dict(r) for r in expected]
    assert {r.pk for r in either} == {shared.pk, own.pk}
    assert either[0].input_per_million == Decimal("3")


def test_column_of_matches_a_column_of_another_row(
    tenant: Any, other_tenant: Any
) -> None:
    """The price of the model an agent names, read in the same statement."""
    agent = Agent.objects.create(tenant=tenant, slug="b", name="b", model="m2")
    for owner, model in [(tenant, "m2"), (None, "m2"), (tenant, "m1"),
                         (other_tenant, "m2")]:  # fmt: skip
        ModelPriceEntry.objects.create(
            tenant=owner, model=model, input_per_million=Decimal(1),
            output_per_million=Decimal(1), cached_input_per_million=Decimal(1),
        )  # fmt: skip
    equal = {"tenant": OrNull(tenant.pk), "model": ColumnOf(Agent, "model", agent.pk)}
    with wire() as sent:
        found = instances_where(ModelPriceEntry, equal, order_by=["id"])
    expected = ModelPriceEntry.objects.filter(
        Q(tenant=tenant) | Q(tenant__isnull=True), model="m2"
    ).order_by("id")
    assert [model_to_dict(r) for r in found] == [model_to_dict(r) for r in expected]
    assert len(found) == 2 and len(sent.executed) == 1  # one statement
    gone = {"model": ColumnOf(Agent, "model", tenant.pk)}
    assert instances_where(ModelPriceEntry, gone) == []  # no such agent


def test_a_conditional_update_changes_only_a_matching_row(run: Run) -> None:
    lost = row_update(
        Run, run.id, {"lease_owner": "x"}, where={"version": run.version + 5}
    )
    assert lost == 0
    assert Run.objects.get(id=run.id).lease_owner == ""
    won = row_update(Run, run.id, {"lease_owner": "x"}, where={"version": run.version})
    assert won == 1
    assert Run.objects.get(id=run.id).lease_owner == "x"


def test_a_prepared_update_runs_later_and_skips_excluded_values(run: Run) -> None:
    """`row_update_statement` converts the values when built (the engine state
    as it was then), and `where_not_in` leaves a row whose field is excluded."""
    state = {"messages": [{"role": "user", "content": "hi"}]}
    statement = row_update_statement(
        Run, run.id, {"engine_state": state, "status": "running"},
        where_not_in={"status": ["succeeded", "failed"]},
    )  # fmt: skip
    state["messages"].append({"role": "assistant", "content": "later"})
    assert Run.objects.get(id=run.id).status != "running"  # nothing ran yet
    assert statement.run() == 1
    stored = Run.objects.get(id=run.id)
    assert stored.status == "running"
    assert stored.engine_state == {"messages": [{"role": "user", "content": "hi"}]}
    Run.objects.filter(id=run.id).update(status="succeeded")
    again = row_update_statement(
        Run, run.id, {"status": "running"},
        where_not_in={"status": ["succeeded", "failed"]},
    )  # fmt: skip
    assert again.run() == 0
    assert Run.objects.get(id=run.id).status == "succeeded"


def test_an_encoded_json_value_is_stored_as_its_text(run: Run) -> None:
    """The text is what goes to the database (read back, it is that JSON), not
    an encoding of the dict it travels with."""
    value = EncodedJSON({"stale": True}, '{"messages": [{"content": "é"}], "n": 1}')
    assert row_update(Run, run.id, {"engine_state": value}) == 1
    stored = Run.objects.get(id=run.id).engine_state
    assert stored == {"messages": [{"content": "é"}], "n": 1}


def test_a_prepared_insert_stores_the_values_it_was_built_with(run: Run) -> None:
    """`rows_insert_statement` converts when built; running it gives the keys."""
    from django.utils import timezone

    from tracing.models import RunEvent

    payload = {"text": "first"}
    statement = rows_insert_statement(
        RunEvent, ["run", "seq", "type", "payload", "created_at"],
        [[run.id, 100, "x", payload, timezone.now()],
         [run.id, 101, "x", {}, timezone.now()]],
    )  # fmt: skip
    payload["text"] = "changed after"
    assert not RunEvent.objects.filter(run=run, seq__gte=100).exists()  # not run yet
    (pks,) = statements_run([statement])
    stored = list(RunEvent.objects.filter(run=run, seq__gte=100).order_by("seq"))
    assert [e.pk for e in stored] == pks
    assert stored[0].payload == {"text": "first"}


def test_a_prepared_instances_insert_reads_its_late_fields_when_it_runs(
    run: Run,
) -> None:
    """The tool calls' insert is built before the step has a key; `late` reads
    the key when the insert runs, and the rows equal what the ORM would store."""
    from django.utils import timezone

    step = Step(run=run, index=0, reply={"text": "x"}, started_at=timezone.now())
    calls = [
        ToolCall(run=run, step=step, position=p, call_id=f"c{p}", tool_name="echo",
                 args={"text": str(p)})
        for p in range(2)
    ]  # fmt: skip
    step_insert = instances_insert_prepare([step])
    calls_insert = instances_insert_prepare(calls, late=["step"])
    step_insert.execute()
    assert step.pk is not None and step._state.adding is False
    for call in calls:
        call.step = step
    calls_insert.execute()
    stored = list(ToolCall.objects.filter(run=run).order_by("position"))
    assert [c.step_id for c in stored] == [step.pk, step.pk]
    assert [fields_of(c) for c in stored] == [fields_of(c) for c in calls]
    assert all(c._state.adding is False for c in calls)


def test_statements_run_in_order_and_report_each_ones_rows(run: Run) -> None:
    """On PostgreSQL in one round trip, each a prepared statement; each one's own
    result: rows changed, keys returned, instances found."""
    from django.db import connection

    from tracing.models import RunEvent

    def batch(first_seq: int) -> list[Any]:
        return [
            row_update_statement(Run, run.id, {"lease_owner": "a"}),
            row_update_statement(Run, run.id, {"lease_owner": "lost"},
                                 where={"version": run.version + 5}),
            row_update_statement(Run, run.id, {"stop_detail": "b"},
                                 where={"lease_owner": "a"}),
            rows_insert_statement(
                RunEvent, ["run", "seq", "type", "payload", "created_at"],
                [[run.id, first_seq + i, "x", {}, run.created_at] for i in range(2)],
            ),
            instances_select(Run, {"id": run.id}, only=["lease_owner"]),
        ]  # fmt: skip

    statements = batch(100)
    with wire() as sent:
        changed, lost, detail, keys, found = statements_run(statements)
    assert (changed, lost, detail) == (1, 0, 1)
    stored = list(RunEvent.objects.filter(run=run, seq__gte=100).order_by("seq"))
    assert keys == [e.pk for e in stored] and len(keys) == 2
    assert [r.lease_owner for r in found] == ["a"]  # it sees the writes before it
    stored_run = Run.objects.get(id=run.id)
    assert (stored_run.lease_owner, stored_run.stop_detail) == ("a", "b")
    if connection.vendor != "postgresql":
        assert sent.round_trips == 5
        # Each as built (the library shows the parameters inline).
        assert len(sent.executed) == len(statements)
        for sql, statement in zip(sent.executed, statements, strict=True):
            assert sql.startswith(statement.sql.split("%s")[0])
    else:
        assert sent.round_trips == 1
        server_sql = [re.sub(r"\$\d+", "%s", sql) for sql in sent.executed]
        assert server_sql == [s.sql for s in statements]
        assert sent.prepared == sent.executed  # each prepared on the server
        # The same shapes again run the statements prepared then: no parse.
        with wire() as again:
            assert statements_run(batch(200))[3] != keys
        assert again.round_trips == 1
        assert len(again.executed) == 5 and again.prepared == []
    with wire() as idle:
        assert statements_run([]) == []
    assert idle.round_trips == 0


def test_without_prepared_statements_a_batch_still_shares_its_round_trip(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DATABASE_PREPARED_STATEMENTS=false (a pooler): nothing is prepared."""
    from django.db import connection

    connection.ensure_connection()
    postgresql = connection.vendor == "postgresql"
    if postgresql:  # what the setting sets, on this test's connection
        monkeypatch.setattr(connection.connection, "prepare_threshold", None)
    statements = [
        row_update_statement(Run, run.id, {"lease_owner": "c"}),
        instances_select(Run, {"id": run.id}, only=["lease_owner"]),
    ]
    with wire() as sent:
        changed, found = statements_run(statements)
        statements_run(statements)
    assert changed == 1 and [r.lease_owner for r in found] == ["c"]
    assert sent.prepared == []
    assert len(sent.executed) == 4
    assert sent.round_trips == (2 if postgresql else 4)


def test_plain_values_pass_as_the_fields_would_convert_them() -> None:
    """The shortcut for plain strings, numbers and booleans gives what each
    field's own conversion gives, on this database."""
    from django.apps import apps
    from django.db import connection

    from controlplane.rows import _PLAIN, _db_value

    samples: dict[type, Any] = {str: "é x", int: 7, bool: True}
    checked = 0
    for model in apps.get_models():
        for field in model._meta.concrete_fields:
            plain = _PLAIN[connection.vendor].get(type(field))
            if plain is None:
                continue
            value = samples[plain]
            converted = field.get_db_prep_save(value, connection)
            assert _db_value(connection, field, value) == converted, field
            assert type(converted) is plain, field
            checked += 1
    assert checked > 20
