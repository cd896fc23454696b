"""Our span processor (database + live stream) and the redacting export wrapper."""

from __future__ import annotations

import contextvars
import datetime as dt
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from django.db import connection
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode

from controlplane.durability import connection_lost
from controlplane.redaction import redact, redact_attributes
from tracing.store import (
    PreparedSpans,
    SpanHandle,
    SpanRecord,
    SpanWrite,
    span_record_end,
    span_record_start,
    spans_prepare,
    spans_store,
    spans_write,
)

__all__ = [
    "RUN_ID_KEY",
    "TENANT_ID_KEY",
    "RedactingSpanExporter",
    "RunSpanProcessor",
    "SpanBatch",
    "long_lived",
    "span_batch",
    "span_batch_flush",
    "span_batch_flush_if_slow",
]

logger = logging.getLogger(__name__)

RUN_ID_KEY = "cp.run.id"
TENANT_ID_KEY = "cp.tenant.id"

# "" (an ordinary span), "start" (a long-lived span starts: its row is written),
# or "resume" (a stored one is started again to be ended: only its end is).
_long_lived: contextvars.ContextVar[Literal["", "start", "resume"]] = (
    contextvars.ContextVar("tracing_long_lived", default="")
)


@contextmanager
def long_lived(*, resumed: bool = False) -> Iterator[None]:
    """Spans started here outlive their task (root, approval wait): no lease.
    `resumed`: the span's row was stored when it started (the caller read it);
    it is started again only to be ended, so its start is not written again."""
    token = _long_lived.set("resume" if resumed else "start")
    try:
        yield
    finally:
        _long_lived.reset(token)


_KINDS = {
    SpanKind.INTERNAL: "internal",
    SpanKind.SERVER: "server",
    SpanKind.CLIENT: "client",
    SpanKind.PRODUCER: "producer",
    SpanKind.CONSUMER: "consumer",
}


def _time(ns: int | None) -> dt.datetime | None:
    if ns is None:
        return None
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC)


def _record_of(span: ReadableSpan, *, ended: bool) -> SpanRecord:
    context = span.get_span_context()
    assert context is not None
    status = "running"
    if ended:
        code = span.status.status_code
        status = {StatusCode.OK: "ok", StatusCode.ERROR: "error"}.get(code, "unset")
    return SpanRecord(
        trace_id=f"{context.trace_id:032x}",
        span_id=f"{context.span_id:016x}",
        parent_span_id=f"{span.parent.span_id:016x}" if span.parent else "",
        name=span.name,
        kind=_KINDS.get(span.kind, "internal"),
        started_at=_time(span.start_time) or dt.datetime.now(dt.UTC),
        ended_at=_time(span.end_time) if ended else None,
        attributes=dict(span.attributes or {}),
        status=status,
        status_message=(span.status.description or "") if ended else "",
        events=[
            {
                "name": event.name,
                "time": (_time(event.timestamp) or dt.datetime.now(dt.UTC)).isoformat(),
                "attributes": dict(event.attributes or {}),
            }
            for event in span.events
        ]
        if ended
        else [],
    )


class SpanBatch:
    """Task span records waiting to be stored together (see `span_batch`)."""

    def __init__(self) -> None:
        self.writes: list[SpanWrite] = []
        self._lock = threading.Lock()

    def flush(self) -> None:
        self.store(self.prepare())

    def prepare(self) -> PreparedSpans | None:
        """Take the records and do what needs no database (before a transaction)."""
        with self._lock:
            writes, self.writes = self.writes, []
        try:
            return spans_prepare(writes)
        except Exception:  # noqa: BLE001 - tracing never breaks a run
            _not_stored(len(writes))
            return None

    def store(self, prepared: PreparedSpans | None) -> None:
        if prepared is None:
            return
        try:
            spans_write(prepared)
        except Exception as exc:  # noqa: BLE001 - tracing never breaks a run
            _unless_transaction_lost(exc)
            _not_stored(len(prepared.writes))

    def flush_from_timer(self) -> None:
        """`flush` on a timer's thread, with a database connection of its own."""
        from django.db import connections

        try:
            self.flush()
        finally:
            connections.close_all()  # this thread's only


def _unless_transaction_lost(exc: Exception) -> None:
    """Re-raise a lost connection inside an enclosing transaction (a step's
    commit). Swallowed, it left that transaction to roll back silently at its
    end: the step went on as if its checkpoint had committed, kept its lease
    unreleased and enqueued nothing, and the run waited out the lease (about
    120 s after a PostgreSQL restart). Outside a transaction nothing else is lost."""
    if connection.in_atomic_block and connection_lost(exc):
        raise exc


def _not_stored(count: int) -> None:
    logger.warning("tracing: could not store %d span records", count, exc_info=True)


_batch: contextvars.ContextVar[SpanBatch | None] = contextvars.ContextVar(
    "tracing_span_batch", default=None
)


@contextmanager
def span_batch() -> Iterator[SpanBatch]:
    """Task spans started or ended here are stored at the next `span_batch_flush`
    (or when it ends) in one transaction, instead of one each: a step's records
    cost a few commits, not six. The order of their events is kept."""
    batch = SpanBatch()
    token = _batch.set(batch)
    try:
        yield batch
    finally:
        _batch.reset(token)
        batch.flush()


@contextmanager
def span_batch_flush_if_slow() -> Iterator[None]:
    """Around a model or tool call: if it still runs after TRACING_SLOW_CALL_MS,
    store the batch then (from a timer thread), so its span shows as running;
    a faster call's start is stored with its end, in the step's next write.

    Inside a transaction (a test's, a caller's) the batch is stored now: another
    connection would not see the rows it refers to.
    """
    from django.conf import settings
    from django.db import connection

    batch = _batch.get()
    if batch is None or not batch.writes:
        yield
        return
    if connection.in_atomic_block:
        batch.flush()
        yield
        return
    alarm = _alarms.set(settings.TRACING_SLOW_CALL_MS / 1000, batch.flush_from_timer)
    try:
        yield
    finally:
        # A flush under way finishes first: the records that follow refer to
        # its rows, and it may be waiting for a lock this thread takes next.
        _alarms.cancel(alarm)


class _Alarms:
    """Callbacks run after a delay unless cancelled first, on one thread per
    process: setting and cancelling one costs a lock, where a `threading.Timer`
    per call started and joined a thread twice a step."""

    def __init__(self) -> None:
        self._pid = 0
        self._keys = itertools.count(1)

    def _start(self) -> None:
        # Once per process: a forked worker inherits no thread.
        self._pid = os.getpid()
        self._wake = threading.Condition()
        self._due: dict[int, tuple[float, Callable[[], None]]] = {}
        self._running = 0
        self._waiting_until = math.inf  # when the thread wakes up next by itself
        threading.Thread(target=self._run, name="span-alarms", daemon=True).start()

    def set(self, seconds: float, callback: Callable[[], None]) -> int:
        if self._pid != os.getpid():
            self._start()
        key = next(self._keys)
        when = time.monotonic() + seconds
        with self._wake:
            self._due[key] = (when, callback)
            if when < self._waiting_until:  # otherwise it wakes up in time anyway
                self._wake.notify()
        return key

    def cancel(self, key: int) -> None:
        """The callback will not run, or has run: wait for it if it is running."""
        with self._wake:
            self._due.pop(key, None)
            while self._running == key:
                self._wake.wait()

    def _run(self) -> None:
        while True:
            with self._wake:
                key, callback = self._next_due()
                self._running = key
            try:
                callback()
            except Exception:  # noqa: BLE001 - the thread serves every later call
                logger.exception("tracing: a slow call's flush failed")
            finally:
                with self._wake:
                    self._running = 0
                    self._wake.notify_all()

    def _next_due(self) -> tuple[int, Callable[[], None]]:
        while True:
            if not self._due:
                self._waiting_until = math.inf
                self._wake.wait()
                continue
            key = min(self._due, key=lambda k: self._due[k][0])
            when, callback = self._due[key]
            delay = when - time.monotonic()
            if delay <= 0:
                del self._due[key]
                return key, callback
            self._waiting_until = when
            self._wake.wait(delay)


_alarms = _Alarms()


def span_batch_flush() -> None:
    """Store what the current batch holds (before a long-lived span's write, so
    the events keep their order)."""
    batch = _batch.get()
    if batch is not None:
        batch.flush()


class RunSpanProcessor(SpanProcessor):
    """Persist every span of a run at start and at end, with a RunEvent for each.

    Only spans carrying `cp.run.id` and `cp.tenant.id` belong to a run. Tracing
    never breaks a run: a failed write is logged and the run carries on.
    A task's own spans are batched inside `span_batch`; long-lived ones (root,
    approval wait) are written at once, after what the batch holds.
    """

    def __init__(self) -> None:
        # The open task spans: the row and payload digests their end reuses.
        self._open: dict[tuple[int, int], SpanHandle] = {}
        self._lock = threading.Lock()

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        ids = self._ids(span)
        if ids is None:
            return
        long = _long_lived.get()
        if long == "resume":  # its row is stored; its end is written in on_end
            return
        record = _record_of(span, ended=False)
        if long:  # ends elsewhere, started again: never in _open
            self._write_now(span, lambda: span_record_start(
                run_id=ids[0], tenant_id=ids[1], record=record, memo={}
            ))  # fmt: skip
            return
        handle = SpanHandle()
        with self._lock:
            self._open[self._key(span)] = handle
        self._store(SpanWrite(ids[0], ids[1], record, handle, ended=False), span)

    def on_end(self, span: ReadableSpan) -> None:
        ids = self._ids(span)
        if ids is None:
            return
        with self._lock:
            handle = self._open.pop(self._key(span), None)
        record = _record_of(span, ended=True)
        if handle is None:  # a long-lived span started again
            self._write_now(span, lambda: span_record_end(
                run_id=ids[0], tenant_id=ids[1], record=record, memo={}
            ))  # fmt: skip
            return
        self._store(SpanWrite(ids[0], ids[1], record, handle, ended=True), span)

    def _store(self, write: SpanWrite, span: ReadableSpan) -> None:
        batch = _batch.get()
        if batch is not None:
            batch.writes.append(write)
        else:
            self._write_now(span, lambda: spans_store([write]))

    @staticmethod
    def _write_now(span: ReadableSpan, write: Callable[[], object]) -> None:
        span_batch_flush()  # what is batched happened first
        try:
            write()
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            _unless_transaction_lost(exc)
            logger.warning("tracing: could not store span %s", span.name, exc_info=True)

    @staticmethod
    def _key(span: ReadableSpan) -> tuple[int, int]:
        context = span.get_span_context()
        assert context is not None
        return context.trace_id, context.span_id

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    @staticmethod
    def _ids(span: ReadableSpan) -> tuple[str, str] | None:
        attributes = span.attributes or {}
        run_id, tenant_id = attributes.get(RUN_ID_KEY), attributes.get(TENANT_ID_KEY)
        if not run_id or not tenant_id:
            return None
        return str(run_id), str(tenant_id)


def redacted_copy(span: ReadableSpan) -> ReadableSpan:
    """The same span with redacted attributes, event attributes and status text."""
    return ReadableSpan(
        name=span.name,
        context=span.get_span_context(),
        parent=span.parent,
        resource=span.resource,
        attributes=redact_attributes(span.attributes),
        events=[
            type(event)(
                event.name, redact_attributes(event.attributes), event.timestamp
            )
            for event in span.events
        ],
        links=span.links,
        kind=span.kind,
        status=span.status
        if not span.status.description
        else type(span.status)(
            span.status.status_code, redact(span.status.description)
        ),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _redacted_status(span: ReadableSpan) -> Any:
    if not span.status.description:
        return span.status
    return type(span.status)(span.status.status_code, redact(span.status.description))


class RedactingSpanExporter(SpanExporter):
    """Wrap an exporter so nothing configured as secret leaves the process."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([redacted_copy(span) for span in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        result: Any = self.inner.force_flush(timeout_millis)
        return bool(result)
