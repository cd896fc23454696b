from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from runs.models import Run
from runs.services import run_start
from tracing import services as tracing_services
from tracing.models import RunEvent, Span
from tracing.services import run_event_append, run_events_append


@pytest.fixture
def run(demo_agent: Any) -> Run:
    return run_start(
        tenant=demo_agent.tenant,
        agent_slug=demo_agent.slug,
        input="hello",
        started_by=None,
    )


def test_events_get_consecutive_seqs_per_run(run: Run, demo_agent: Any) -> None:
    other = run_start(
        tenant=demo_agent.tenant, agent_slug=demo_agent.slug, input="x", started_by=None
    )
    first = run_event_append(run=run, type="run.note", payload={"n": 1})
    second = run_event_append(run=run, type="run.note", payload={"n": 2})
    elsewhere = run_event_append(run=other, type="run.note", payload={"n": 3})
    assert (first.seq + 1, elsewhere.seq) == (second.seq, first.seq)


def test_a_writer_that_loses_the_seq_takes_the_next_one(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_event_append(run=run, type="run.note", payload={})
    taken = RunEvent.objects.filter(run=run).count()
    # A competing writer (another process) took the seq this process would
    # compute from the last one it committed, and the one after.
    rivals = [
        RunEvent.objects.create(run=run, seq=taken + 1, type="rival"),
        RunEvent.objects.create(run=run, seq=taken + 2, type="rival"),
    ]
    monkeypatch.setitem(tracing_services._committed_seq, run.pk, taken)  # stale
    first, second = run_events_append(
        run=run, events=[("mine", {"n": 1}), ("mine", {"n": 2})]
    )
    assert (first.seq, second.seq) == (taken + 3, taken + 4)
    assert [r.seq for r in rivals] == [taken + 1, taken + 2]
    assert list(RunEvent.objects.filter(run=run).values_list("seq", flat=True)) == list(
        range(1, taken + 5)
    )
    assert RunEvent.objects.filter(run=run, type="mine").count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_broadcast_follows_the_commit_and_reaches_run_and_tenant(
    demo_agent: Any,
) -> None:
    layer = get_channel_layer()
    run = run_start(
        tenant=demo_agent.tenant, agent_slug=demo_agent.slug, input="x", started_by=None
    )
    run_channel = async_to_sync(layer.new_channel)()
    tenant_channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(f"run.{run.id}", run_channel)
    async_to_sync(layer.group_add)(f"tenant.{run.tenant_id}", tenant_channel)
    try:
        with transaction.atomic():
            event = run_event_append(run=run, type="run.note", payload={"k": "v"})
            rolled_back = None
            try:
                with transaction.atomic():
                    rolled_back = run_event_append(run=run, type="run.gone", payload={})
                    raise RuntimeError
            except RuntimeError:
                pass
        got = async_to_sync(layer.receive)(run_channel)
        assert got["event"]["seq"] == event.seq
        assert got["event"]["payload"] == {"k": "v"}
        assert async_to_sync(layer.receive)(tenant_channel)["event"]["seq"] == event.seq
        assert rolled_back is not None
        assert not RunEvent.objects.filter(type="run.gone").exists()
    finally:
        async_to_sync(layer.group_discard)(f"run.{run.id}", run_channel)
        async_to_sync(layer.group_discard)(f"tenant.{run.tenant_id}", tenant_channel)


def test_a_group_nobody_listens_to_is_not_sent_to() -> None:
    """Most runs are not watched: the broadcaster asks whether the group has
    members (one round trip) before channels-redis's group_send."""
    import uuid

    from tracing.broadcast import _has_members

    layer = get_channel_layer()
    group = f"run.{uuid.uuid4()}"
    assert not async_to_sync(_has_members)(layer, group)
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group, channel)
    assert async_to_sync(_has_members)(layer, group)
    async_to_sync(layer.group_discard)(group, channel)
    assert not async_to_sync(_has_members)(layer, group)


def test_a_span_batch_logs_each_new_row_once_with_its_stored_key(run: Run) -> None:
    """The events of new span rows are encoded before the transaction and get
    their row's key after the insert: what is stored is the row's wire form."""
    from django.utils import timezone

    from tracing.store import (
        SpanHandle,
        SpanRecord,
        SpanWrite,
        span_event_payload,
        spans_store,
    )

    now = timezone.now()

    def record(span_id: str, ended: bool) -> SpanRecord:
        return SpanRecord(
            trace_id="ab" * 16, span_id=span_id, parent_span_id="", name=span_id,
            kind="internal", started_at=now, attributes={"k": "é", "n": 1},
            ended_at=now if ended else None, status="ok" if ended else "running",
        )  # fmt: skip

    complete, running = SpanHandle(), SpanHandle()
    spans_store([
        SpanWrite(run.pk, run.tenant_id, record("c" * 16, False), complete, False),
        SpanWrite(run.pk, run.tenant_id, record("d" * 16, False), running, False),
        SpanWrite(run.pk, run.tenant_id, record("c" * 16, True), complete, True),
    ])  # fmt: skip
    events = list(
        RunEvent.objects.filter(run=run, type__startswith="span.").order_by("seq")
    )
    assert [e.type for e in events] == ["span.started", "span.ended"]
    assert running.pk is not None and complete.pk is not None  # the keys came back
    assert events[0].payload == span_event_payload(Span.objects.get(pk=running.pk))
    assert events[1].payload == {
        **span_event_payload(Span.objects.get(pk=complete.pk)),
        "first_event": True,
    }
    assert list(events[1].payload)[0] == "id"  # the key first, as the stream has it


def _span_write(run: Run, span_id: str) -> Any:
    from django.utils import timezone

    from tracing.store import SpanHandle, SpanRecord, SpanWrite

    now = timezone.now()
    record = SpanRecord(
        trace_id="ab" * 16, span_id=span_id, parent_span_id="", name=span_id,
        kind="internal", started_at=now, ended_at=now, status="ok",
    )  # fmt: skip
    handle = SpanHandle()
    return [
        SpanWrite(run.pk, run.tenant_id, record, handle, False),
        SpanWrite(run.pk, run.tenant_id, record, handle, True),
    ]


def test_a_step_whose_span_events_lose_the_seq_keeps_its_own_writes(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's spans are written inside its transaction with no savepoint
    around the events: a seq another writer took rolls back the spans alone,
    which are written again after the rival's events; the step's own write stays."""
    from tracing.store import spans_store

    run_event_append(run=run, type="run.note", payload={})
    taken = RunEvent.objects.filter(run=run).count()
    RunEvent.objects.create(run=run, seq=taken + 1, type="rival")
    monkeypatch.setitem(tracing_services._committed_seq, run.pk, taken)  # stale
    with transaction.atomic():
        Run.objects.filter(pk=run.pk).update(stop_detail="the step's write")
        spans_store(_span_write(run, "e" * 16))
    assert Run.objects.get(pk=run.pk).stop_detail == "the step's write"
    assert Span.objects.filter(run=run, span_id="e" * 16).count() == 1
    ended = RunEvent.objects.get(run=run, type="span.ended")
    assert ended.seq == taken + 2
    assert ended.payload["span_id"] == "e" * 16


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_share_one_gapless_seq(demo_agent: Any) -> None:
    """A worker storing span batches (no savepoint around its events) and the
    web appending approval events (with one) to the same run at the same time:
    every event is stored once, and the run's seqs are 1..n without a gap."""
    import threading

    from django.db import connections

    from tracing.store import spans_store

    run = run_start(
        tenant=demo_agent.tenant, agent_slug=demo_agent.slug, input="x", started_by=None
    )
    before = RunEvent.objects.filter(run=run).count()
    rounds = 40
    start = threading.Barrier(2)
    failures: list[BaseException] = []

    def worker() -> None:
        try:
            start.wait()
            for index in range(rounds):
                with transaction.atomic():  # a step's closing transaction
                    Run.objects.filter(pk=run.pk).update(steps=index)
                    spans_store(_span_write(run, f"{index:016x}"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            connections.close_all()

    def web() -> None:
        try:
            start.wait()
            for index in range(rounds):
                with transaction.atomic():
                    run_event_append(
                        run=run, type="approval.requested", payload={"n": index}
                    )
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker), threading.Thread(target=web)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    seqs = list(
        RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True)
    )
    assert seqs == list(range(1, before + 2 * rounds + 1))
    assert RunEvent.objects.filter(run=run, type="span.ended").count() == rounds
    assert RunEvent.objects.filter(run=run, type="approval.requested").count() == rounds
    assert Span.objects.filter(run=run).count() == rounds
