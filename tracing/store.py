"""Writes of spans: a row at start, the same row completed at end, payloads stored
once, and a RunEvent for each so the live stream and its replay see them."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from runs.models import Run
from tracing.models import RunEvent, Span, SpanPayload
from tracing.redaction import redact, redact_attributes
from tracing.services import run_event_append

__all__ = [
    "PAYLOAD_KEYS",
    "SpanRecord",
    "payload_encode",
    "payload_store",
    "span_abandon",
    "span_event_payload",
    "span_record_end",
    "span_record_start",
]

# Attributes that carry model input/output and tool arguments/results: stored as
# payloads (once, by hash, not truncated below TRACING_PAYLOAD_MAX_BYTES) and
# referenced from the span, so span rows and stream events stay small.
PAYLOAD_KEYS = frozenset(
    {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "gen_ai.tool.definitions",
    }
)


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
    leased: bool = False  # a worker holds it: abandoned when the lease expires


def _json_default(value: Any) -> Any:
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    return str(value)


def payload_encode(value: Any) -> tuple[str, str, int]:
    """Redact and serialise a payload: (sha256, JSON text, size in bytes).

    Kept whole up to TRACING_PAYLOAD_MAX_BYTES (at least 1 MB); a larger one is
    stored as its head with a note of its full size.
    """
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    value = redact(value)
    text = json.dumps(value, ensure_ascii=False, default=_json_default)
    limit = settings.TRACING_PAYLOAD_MAX_BYTES
    encoded = text.encode()
    if len(encoded) > limit:
        head = encoded[:limit].decode("utf-8", "ignore")
        text = json.dumps({"truncated": True, "size_bytes": len(encoded), "head": head})
        encoded = text.encode()
    return hashlib.sha256(encoded).hexdigest(), text, len(encoded)


def payload_store(*, tenant_id: Any, value: Any) -> str:
    """Store a (redacted) payload once per tenant; return its sha256."""
    digest, text, size = payload_encode(value)
    SpanPayload.objects.bulk_create(
        [SpanPayload(tenant_id=tenant_id, sha256=digest, size=size, content=text)],
        ignore_conflicts=True,
    )
    return digest


# Payload digests by (span, attribute) with the raw value they were computed
# from: a span's end repeats its start's attributes, identical objects.
PayloadMemo = dict[str, tuple[Any, str]]


def _split_payloads(
    tenant_id: Any, raw: Mapping[str, Any], memo: PayloadMemo | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    plain: dict[str, Any] = {}
    payloads: dict[str, str] = {}
    for key, value in raw.items():
        if key in PAYLOAD_KEYS:
            known = memo.get(key) if memo is not None else None
            if known is not None and known[0] is value:
                payloads[key] = known[1]
                continue
            payloads[key] = payload_store(tenant_id=tenant_id, value=value)
            if memo is not None:
                memo[key] = (value, payloads[key])
        else:
            plain[key] = list(value) if isinstance(value, tuple) else value
    return redact_attributes(plain), payloads


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


@contextlib.contextmanager
def telemetry_transaction() -> Iterator[None]:
    """A transaction for span rows and their events.

    When it is the outermost transaction on PostgreSQL, its commit does not wait
    for the WAL flush (`synchronous_commit = off` for this transaction only): a
    database crash may lose the last few spans, never a run's state, which is
    always written in transactions of its own with the server's durability.
    """
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit = off")
        yield


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"[:64]


def _run_ref(run_id: Any, tenant_id: Any) -> Run:
    # run_event_append needs only the ids; no query for the run itself.
    return Run(id=run_id, tenant_id=tenant_id)


def span_record_start(
    *,
    run_id: Any,
    tenant_id: Any,
    record: SpanRecord,
    memo: PayloadMemo | None = None,
) -> Span:
    """Store a started span (once: a span started again with the same ids, as a
    long wait ending in another process, keeps its row) and log `span.started`."""
    lease = None
    if record.leased:
        lease = timezone.now() + dt.timedelta(
            seconds=settings.TRACING_SPAN_LEASE_SECONDS
        )
    with telemetry_transaction():  # payloads, span and event in one commit
        attributes, payloads = _split_payloads(tenant_id, record.attributes, memo)
        fields = {
            "run_id": run_id,
            "parent_span_id": record.parent_span_id,
            "name": record.name[:300],
            "kind": record.kind,
            "started_at": record.started_at,
            "attributes": attributes,
            "payloads": payloads,
            "worker": _worker_name() if record.leased else "",
            "lease_expires_at": lease,
        }
        if record.leased:
            # A task's own span: new ids, never seen before.
            span = Span.objects.create(
                trace_id=record.trace_id, span_id=record.span_id, **fields
            )
            created = True
        else:
            span, created = Span.objects.get_or_create(
                trace_id=record.trace_id, span_id=record.span_id, defaults=fields
            )
        if created:
            run_event_append(
                run=_run_ref(run_id, tenant_id),
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
    pk: int | None = None,
) -> Span:
    """Complete (or create, for a span we never saw start) the span's row and log
    `span.ended`. A task's own span (`leased`, `pk` known from its start) carries
    all its attributes at the end: one UPDATE. A long-lived span started again
    merges into the row it had."""
    events = redact(record.events)
    ended_at = record.ended_at or timezone.now()
    with telemetry_transaction():  # payloads, span and event in one commit
        attributes, payloads = _split_payloads(tenant_id, record.attributes, memo)
        span: Span | None = None
        if record.leased and pk is not None:
            span = Span(
                pk=pk,
                run_id=run_id,
                trace_id=record.trace_id,
                span_id=record.span_id,
                parent_span_id=record.parent_span_id,
                name=record.name[:300],
                kind=record.kind,
                status=record.status,
                status_message=redact(record.status_message),
                started_at=record.started_at,
                ended_at=ended_at,
                attributes=attributes,
                payloads=payloads,
                events=events,
                worker=_worker_name(),
                lease_expires_at=None,
            )
            updated = Span.objects.filter(pk=pk, status=Span.Status.RUNNING).update(
                name=span.name,
                kind=span.kind,
                status=span.status,
                status_message=span.status_message,
                ended_at=ended_at,
                attributes=attributes,
                payloads=payloads,
                events=events,
                lease_expires_at=None,
            )
            if not updated:
                span = None  # abandoned meanwhile, or gone: the general path
        if span is None:
            span = (
                Span.objects.select_for_update()
                .filter(trace_id=record.trace_id, span_id=record.span_id)
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
            span.ended_at = ended_at
            span.attributes = {**span.attributes, **attributes}
            span.payloads = {**span.payloads, **payloads}
            span.events = events
            span.lease_expires_at = None
            span.save()
        run_event_append(
            run=_run_ref(run_id, tenant_id),
            type="span.ended",
            payload=span_event_payload(span),
        )
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
        run = Run.objects.only("id", "tenant_id").get(id=span.run_id)
        run_event_append(
            run=run, type="span.abandoned", payload=span_event_payload(span)
        )
    return True


def events_after(*, run_id: Any, after_seq: int, limit: int) -> list[RunEvent]:
    return list(
        RunEvent.objects.filter(run_id=run_id, seq__gt=after_seq).order_by("seq")[
            :limit
        ]
    )


def spans_abandon_expired() -> int:
    """Mark running spans whose worker's lease ran out; return how many."""
    expired = Span.objects.filter(
        status=Span.Status.RUNNING, lease_expires_at__lt=timezone.now()
    )
    return sum(
        span_abandon(span=span, reason="its worker's lease expired")
        for span in expired[:1000]
    )
