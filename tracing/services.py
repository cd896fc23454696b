"""Writes of the run event log: append with the next per-run seq, broadcast."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from controlplane.redaction import redact
from tracing.broadcast import broadcaster
from tracing.models import RunEvent

__all__ = [
    "RunIds",
    "RunRef",
    "SeqConflict",
    "SeqTaken",
    "event_message",
    "run_event_append",
    "run_event_broadcast",
    "run_events_append",
    "run_group",
    "tenant_group",
]

logger = logging.getLogger(__name__)

# Events of these types also go to the tenant-wide stream (runs list, approvals
# inbox, its questions); span events are many and only the run stream carries them.
TENANT_EVENT_PREFIXES = ("run.", "approval.", "question.", "step.", "budget.")

# Span events are built from span rows the store has already redacted.
SPAN_EVENT_PREFIX = "span."

# Each lost race is a seq another writer committed, so the log moves on; the
# bound only stops a writer that is starved outright. A step's writer appends
# in a tight loop, and under load it took 20 seqs in a row ahead of a
# decision's one event.
_APPEND_ATTEMPTS = 200


class RunRef(Protocol):
    """What the event log needs of a run: its key and its tenant's. A `runs.Run`
    row is one; so is `RunIds`, for a writer that holds only the ids."""

    @property
    def pk(self) -> Any: ...

    @property
    def tenant_id(self) -> Any: ...


@dataclass(frozen=True)
class RunIds:
    """A run named by its ids (no query for the row)."""

    pk: Any
    tenant_id: Any


class SeqConflict(RuntimeError):
    """Another writer kept taking the next seq; the append gave up."""


class SeqTaken(IntegrityError):
    """An append without a savepoint of its own (`enclosed=True`) lost its seq,
    or failed its insert: the caller rolls back its block and writes it again
    with `enclosed=False`."""


def run_group(run_id: object) -> str:
    return f"run.{run_id}"


def tenant_group(tenant_id: object) -> str:
    return f"tenant.{tenant_id}"


def event_message(event: RunEvent) -> dict[str, Any]:
    """The wire form of an event, the same in replay, live stream and REST."""
    return {
        "id": event.pk,
        "run_id": str(event.run_id),
        "seq": event.seq,
        "type": event.type,
        "payload": _readable(event.type, event.payload),
        "created_at": event.created_at.isoformat(),
    }


def _readable(type: str, payload: Any) -> Any:
    """The payload redacted. A span event is made from the span's stored (already
    redacted) row, the hot path of a live trace; the few other events (approvals,
    budgets) are redacted again when read, which also covers rows logged before
    the rule caught what they hold."""
    return payload if type.startswith(SPAN_EVENT_PREFIX) else redact(payload)


_committed_seq: dict[Any, int] = {}


def _max_seq(run_id: Any) -> int:
    last = RunEvent.objects.filter(run_id=run_id).aggregate(m=Max("seq"))["m"]
    return int(last or 0)


def _remember(run_id: Any, seq: int) -> None:
    if len(_committed_seq) > 10_000:
        _committed_seq.clear()
    _committed_seq[run_id] = max(seq, _committed_seq.get(run_id, 0))


def run_event_append(*, run: RunRef, type: str, payload: dict[str, Any]) -> RunEvent:
    """Append an event with the run's next seq and broadcast it once committed.

    The caller's transaction, if any, is kept; the broadcast waits for the
    outermost commit.
    """
    return run_events_append(run=run, events=[(type, payload)])[0]


def run_events_append(
    *,
    run: RunRef,
    events: Sequence[tuple[str, dict[str, Any]]],
    announce: Literal["each", "last"] = "each",
    enclosed: bool = False,
) -> list[RunEvent]:
    """Append events, in order, with the run's next consecutive seqs (one insert).
    This is the run event log's one seq allocator (every writer comes here).

    `announce="last"` broadcasts only the last event, for a batch that may be
    longer than a stream's queue (an ingested trace): a stream that sees the
    jump in seq fills the rest from the log at its client's pace.

    The unique (run, seq) constraint decides between concurrent writers: the
    insert runs in a savepoint, so a seq already taken fails only it (the
    caller's transaction goes on), and the loser takes the next numbers.

    `enclosed=True`: the caller's own savepoint (or transaction) encloses the
    append and holds only what it can write again, so the insert goes without
    a savepoint of its own (two round trips fewer). A failed insert then raises
    `SeqTaken` and forgets the seq this process remembered; the caller rolls
    its block back and writes it again with `enclosed=False` (the span writes
    of a step, `tracing.store.spans_write`, do so).
    """
    readable = [(type, _readable(type, payload)) for type, payload in events]
    # The last committed seq seen by this process saves the MAX query when this
    # process is the run's only writer (the lease holder); it is only ever
    # behind the database, so a stale value costs one conflict and a re-read.
    last = _committed_seq.get(run.pk)
    if last is None:
        last = _max_seq(run.pk)
    now = timezone.now()
    for _ in range(_APPEND_ATTEMPTS):
        rows = [
            RunEvent(
                run_id=run.pk, seq=last + offset, type=type, payload=payload,
                created_at=now,
            )
            for offset, (type, payload) in enumerate(readable, start=1)
        ]  # fmt: skip
        if enclosed:
            try:
                RunEvent.objects.bulk_create(rows)
            except IntegrityError as exc:
                # On PostgreSQL the transaction is aborted: no re-read here.
                _committed_seq.pop(run.pk, None)
                raise SeqTaken(str(exc)) from exc
        else:
            try:
                with transaction.atomic():
                    RunEvent.objects.bulk_create(rows)
            except IntegrityError:
                taken = _max_seq(run.pk)
                if taken <= last:  # not a seq another writer took
                    raise
                last = taken
                continue
        transaction.on_commit(functools.partial(_remember, run.pk, rows[-1].seq))
        announced = rows if announce == "each" else rows[-1:]
        transaction.on_commit(
            functools.partial(_broadcast_all, events=announced, tenant_id=run.tenant_id)
        )
        return rows
    raise SeqConflict(f"run {run.pk}: no free seq after {_APPEND_ATTEMPTS} attempts")


def _broadcast_all(*, events: list[RunEvent], tenant_id: object) -> None:
    with broadcaster().together():
        for event in events:
            run_event_broadcast(event=event, tenant_id=tenant_id)


def run_event_broadcast(*, event: RunEvent, tenant_id: object) -> None:
    """Send a committed event to the run's group (and the tenant's, for run-level
    types). The layer is a fast path: a lost message is refilled from the log by
    the consumer, so a layer failure is logged, never raised."""
    groups = [run_group(event.run_id)]
    if event.type.startswith(TENANT_EVENT_PREFIXES):
        groups.append(tenant_group(tenant_id))
    message = {"type": "run.event", "event": event_message(event)}
    try:
        broadcaster().send(groups, message)
    except Exception:  # noqa: BLE001 - the log is the record, the layer best effort
        logger.warning("broadcast of %s failed", event, exc_info=True)
