"""Span rows: a row at start, the same row completed at end (its payloads stored
once, see `tracing.payloads`), and a RunEvent for each so the live stream and its
replay see them."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from controlplane.durability import recoverable_transaction
from controlplane.failpoints import failpoint
from controlplane.redaction import redact
from tracing.models import Span, SpanPayload
from tracing.payloads import PayloadMemo, payloads_split
from tracing.services import RunIds, SeqTaken, run_event_append, run_events_append

__all__ = [
    "SpanHandle",
    "SpanRecord",
    "SpanWrite",
    "span_abandon",
    "span_event_payload",
    "span_record_end",
    "span_record_start",
    "spans_prepare",
    "spans_store",
    "spans_write",
]


@dataclass
class SpanRecord:
    """A span as the store sees it, whatever produced it (our SDK or ingest)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    started_at: dt.datetime
    attributes: Mapping[str, Any] = field(default_factory=dict)
    ended_at: dt.datetime | None = None
    status: str = Span.Status.RUNNING
    status_message: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)


def span_event_payload(span: Span) -> dict[str, Any]:
    """The wire form of a span (events, REST lists): everything but payload bodies."""
    return {
        "id": span.pk,
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "parent_span_id": span.parent_span_id,
        "name": span.name,
        "kind": span.kind,
        "status": span.status,
        "status_message": span.status_message,
        "started_at": span.started_at.isoformat(),
        "ended_at": span.ended_at.isoformat() if span.ended_at else None,
        "attributes": span.attributes,
        "events": span.events,
        "payloads": span.payloads,
    }


def telemetry_transaction() -> contextlib.AbstractContextManager[None]:
    """A transaction for span rows and their events: recoverable (a database crash
    may lose the last few spans, never a run's state that came after them).
    Inside a step's transaction it is a savepoint: a failed span write loses
    only the spans (and their commit hooks)."""
    return recoverable_transaction()


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"[:64]


@dataclass
class SpanHandle:
    """What the start and the end of one task span share: its row, once stored,
    and the payload digests computed at start (the end repeats those values)."""

    memo: PayloadMemo = field(default_factory=dict)
    pk: int | None = None


@dataclass
class SpanWrite:
    """A task span's start or end, waiting to be stored (see `spans_store`)."""

    run_id: Any
    tenant_id: Any
    record: SpanRecord
    handle: SpanHandle
    ended: bool


def spans_store(writes: list[SpanWrite]) -> None:
    """Store the starts and ends of task spans (a worker holds them), in order,
    with one `span.started` / `span.ended` event each: one transaction, one insert
    for the payloads, one for the new rows, one per run for the events.

    A span whose start and end are both here is inserted complete, with one
    event, `span.ended` marked `first_event` (the stream knows its children
    then: their events came with it).
    """
    spans_write(spans_prepare(writes))


@dataclass
class PreparedSpans:
    """Span writes with their payloads encoded and new rows built (no database):
    taken from a batch before the transaction that stores them, they can be
    stored again if it rolls back."""

    writes: list[tuple[SpanWrite, dict[str, Any], dict[str, str]]]
    new_rows: dict[int, Span]  # by handle
    new_payloads: list[SpanPayload]
    # The event of each new row, but for the row's key (by handle).
    new_events: dict[int, dict[str, Any]]


def spans_prepare(writes: list[SpanWrite]) -> PreparedSpans:
    """Everything of `spans_store` that needs no database."""
    pending: dict[tuple[Any, str], SpanPayload] = {}
    ended = {id(w.handle) for w in writes if w.ended}
    prepared = [
        # A start whose end is here too is stored whole from its end, whose
        # attributes hold the start's and what was set later (tokens, output,
        # results): its own are not split.
        (write, {}, {})
        if not write.ended and write.handle.pk is None and id(write.handle) in ended
        else (write, *payloads_split(
            write.tenant_id, write.record.attributes, write.handle.memo, pending
        ))
        for write in writes
    ]  # fmt: skip
    ends = {id(w.handle): item for item in prepared if (w := item[0]).ended}
    new_rows: dict[int, Span] = {}  # by handle
    for write, attributes, payloads in prepared:
        if write.ended or write.handle.pk is not None:
            continue
        # Stored whole: times, status and attributes all from its end.
        end_write, attributes, payloads = ends.get(
            id(write.handle), (write, attributes, payloads)
        )
        new_rows[id(write.handle)] = _leased_row(
            write, end_write.record, attributes, payloads
        )
    new_events = {}
    for handle, row in new_rows.items():
        event = span_event_payload(row)
        del event["id"]
        if row.ended_at is not None:  # stored complete: no `span.started` first
            event["first_event"] = True
        new_events[handle] = event
    return PreparedSpans(prepared, new_rows, list(pending.values()), new_events)


def spans_write(spans: PreparedSpans) -> None:
    """The database part of `spans_store`."""
    if not spans.writes:
        return
    try:
        # The events go in without a savepoint of their own: the telemetry
        # savepoint (or transaction) holds only span rows, which can be written
        # again. A seq another writer took meanwhile rolls it back, and it is
        # written again with the allocator's retrying savepoint.
        _spans_write(spans, enclosed=True)
    except SeqTaken:
        _spans_write(spans, enclosed=False)


def _spans_write(spans: PreparedSpans, *, enclosed: bool) -> None:
    prepared, new_rows = spans.writes, spans.new_rows
    in_savepoint = connection.in_atomic_block
    with telemetry_transaction():
        if in_savepoint:
            # Where a lost connection leaves the enclosing transaction (a
            # step's commit) to roll back, unless tracing re-raises it.
            failpoint("inside_span_savepoint")
        if spans.new_payloads:  # a payload stored already is the same by its hash
            SpanPayload.objects.bulk_create(spans.new_payloads, ignore_conflicts=True)
        for new in new_rows.values():
            new.pk = None  # a key from a rolled-back attempt is not the row's
        Span.objects.bulk_create(list(new_rows.values()))
        events: dict[tuple[Any, Any], list[tuple[str, dict[str, Any]]]] = {}
        for write, attributes, payloads in prepared:
            handle = id(write.handle)
            row = new_rows.get(handle)
            if row is not None:
                if not write.ended:
                    write.handle.pk = row.pk
                if write.ended == (row.ended_at is not None):  # one event a row
                    kind = "span.ended" if write.ended else "span.started"
                    events.setdefault((write.run_id, write.tenant_id), []).append(
                        (kind, {"id": row.pk, **spans.new_events[handle]})
                    )
                continue
            ended = span_event_payload(_leased_end(write, attributes, payloads))
            events.setdefault((write.run_id, write.tenant_id), []).append(
                ("span.ended", ended)
            )
        for (run_id, tenant_id), run_events in events.items():
            run_events_append(
                run=RunIds(run_id, tenant_id), events=run_events, enclosed=enclosed
            )


def _leased_row(
    write: SpanWrite,
    record: SpanRecord,
    attributes: dict[str, Any],
    payloads: dict[str, str],
) -> Span:
    ended = record.ended_at is not None
    return Span(
        run_id=write.run_id,
        trace_id=record.trace_id,
        span_id=record.span_id,
        parent_span_id=record.parent_span_id,
        name=record.name[:300],
        kind=record.kind,
        status=record.status,
        status_message=redact(record.status_message),
        started_at=record.started_at,
        ended_at=record.ended_at,
        attributes=attributes,
        payloads=payloads,
        events=redact(record.events),
        worker=_worker_name(),
        lease_expires_at=None
        if ended
        else timezone.now() + dt.timedelta(seconds=settings.TRACING_SPAN_LEASE_SECONDS),
    )


def _leased_end(
    write: SpanWrite, attributes: dict[str, Any], payloads: dict[str, str]
) -> Span:
    """Complete the row stored at start; one UPDATE (it carries all attributes)."""
    record = write.record
    row = _leased_row(write, record, attributes, payloads)
    row.pk = write.handle.pk
    updated = Span.objects.filter(pk=row.pk, status=Span.Status.RUNNING).update(
        name=row.name,
        kind=row.kind,
        status=row.status,
        status_message=row.status_message,
        ended_at=row.ended_at,
        attributes=attributes,
        payloads=payloads,
        events=row.events,
        lease_expires_at=None,
    )
    if updated:
        return row
    # Abandoned meanwhile, or gone: the general path.
    return _span_end_row(write.run_id, record, attributes, payloads)


def span_record_start(
    *,
    run_id: Any,
    tenant_id: Any,
    record: SpanRecord,
    memo: PayloadMemo | None = None,
) -> Span:
    """Store a long-lived span's start (once: started again with the same ids, as a
    long wait ending in another process, it keeps its row) and log `span.started`."""
    with telemetry_transaction():  # payloads, span and event in one commit
        attributes, payloads = payloads_split(tenant_id, record.attributes, memo)
        # Looked up in its run: span ids are unique per run (and so per tenant),
        # another tenant may hold the same ids.
        span, created = Span.objects.get_or_create(
            run_id=run_id,
            span_id=record.span_id,
            defaults={
                "trace_id": record.trace_id,
                "parent_span_id": record.parent_span_id,
                "name": record.name[:300],
                "kind": record.kind,
                "started_at": record.started_at,
                "attributes": attributes,
                "payloads": payloads,
            },
        )
        if created:
            run_event_append(
                run=RunIds(run_id, tenant_id),
                type="span.started",
                payload=span_event_payload(span),
            )
    return span


def span_record_end(
    *,
    run_id: Any,
    tenant_id: Any,
    record: SpanRecord,
    memo: PayloadMemo | None = None,
) -> Span:
    """Complete (or create, for a span we never saw start) the span's row and log
    `span.ended`; a long-lived span started again merges into the row it had."""
    with telemetry_transaction():  # payloads, span and event in one commit
        attributes, payloads = payloads_split(tenant_id, record.attributes, memo)
        span = _span_end_row(run_id, record, attributes, payloads)
        run_event_append(
            run=RunIds(run_id, tenant_id),
            type="span.ended",
            payload=span_event_payload(span),
        )
    return span


def _span_end_row(
    run_id: Any,
    record: SpanRecord,
    attributes: dict[str, Any],
    payloads: dict[str, str],
) -> Span:
    span = (
        Span.objects.select_for_update()
        .filter(run_id=run_id, span_id=record.span_id)
        .first()
    )
    if span is None:
        span = Span(
            run_id=run_id,
            trace_id=record.trace_id,
            span_id=record.span_id,
            parent_span_id=record.parent_span_id,
            started_at=record.started_at,
        )
    span.name = record.name[:300]
    span.kind = record.kind
    span.status = record.status
    span.status_message = redact(record.status_message)
    span.ended_at = record.ended_at or timezone.now()
    span.attributes = {**span.attributes, **attributes}
    span.payloads = {**span.payloads, **payloads}
    span.events = redact(record.events)
    span.lease_expires_at = None
    span.save()
    return span


def span_abandon(*, span: Span, reason: str) -> bool:
    """Mark a running span whose producer is gone; False if it ended meanwhile."""
    now = timezone.now()
    with transaction.atomic():
        won = Span.objects.filter(id=span.pk, status=Span.Status.RUNNING).update(
            status=Span.Status.ABANDONED,
            status_message=reason,
            ended_at=now,
            lease_expires_at=None,
        )
        if not won:
            return False
        span.refresh_from_db()
        tenant_id = (
            Span.objects.filter(pk=span.pk)
            .values_list("run__tenant_id", flat=True)
            .get()
        )
        run_event_append(
            run=RunIds(span.run_id, tenant_id),
            type="span.abandoned",
            payload=span_event_payload(span),
        )
    return True


def spans_abandon_expired() -> int:
    """Mark running spans whose worker's lease ran out; return how many."""
    expired = Span.objects.filter(
        status=Span.Status.RUNNING, lease_expires_at__lt=timezone.now()
    )
    return sum(
        span_abandon(span=span, reason="its worker's lease expired")
        for span in expired[:1000]
    )
