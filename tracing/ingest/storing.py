"""Storing ingested spans in the run their caller names (tracing holds runs by
id; which run a trace is, and whether it may be written, is the runs app's call).

A span id names one span within its run, so a span sent again (an exporter's
retry) updates its row there; another run's spans, with whatever ids, are never
read or written.
"""

from __future__ import annotations

from typing import Any

from controlplane.redaction import redact, redact_attributes
from tracing.ingest.log_storing import log_messages_claim, log_payloads_merge
from tracing.ingest.mapping import TraceSummary
from tracing.ingest.otlp import OtlpSpan, time_of
from tracing.models import Span, SpanPayload
from tracing.payloads import PAYLOAD_KEYS, payload_encode
from tracing.services import RunIds, run_events_append
from tracing.store import span_event_payload

__all__ = ["trace_store"]


def _payload_rows(
    tenant_id: Any,
    attributes: dict[str, Any],
    rows: dict[str, SpanPayload],
    encodings: dict[str, tuple[str, str, int]],
) -> tuple[dict[str, Any], dict[str, str]]:
    plain: dict[str, Any] = {}
    refs: dict[str, str] = {}
    for key, value in attributes.items():
        if key not in PAYLOAD_KEYS:
            plain[key] = value
            continue
        cache_key = value if isinstance(value, str) else None
        encoded = encodings.get(cache_key) if cache_key is not None else None
        if encoded is None:
            encoded = payload_encode(value)
            if cache_key is not None:
                encodings[cache_key] = encoded
        digest, text, size = encoded
        rows.setdefault(
            digest,
            SpanPayload(tenant_id=tenant_id, sha256=digest, size=size, content=text),
        )
        refs[key] = digest
    return plain, refs


_UPDATED_FIELDS = [
    "parent_span_id", "name", "kind", "status", "status_message",
    "started_at", "ended_at", "attributes", "events", "payloads",
]  # fmt: skip


def trace_store(
    *, tenant_id: Any, run_id: Any, trace_id: str, spans: list[OtlpSpan]
) -> TraceSummary:
    """Create or update the trace's spans in run `run_id` of tenant `tenant_id`,
    log one `span.ended` event each; return what they say about the run. The
    caller holds the transaction (`tracing.store.telemetry_transaction`)."""
    payloads: dict[str, SpanPayload] = {}
    encodings: dict[str, tuple[str, str, int]] = {}  # the same prompt, once
    rows: list[Span] = []
    summary = TraceSummary()
    # A span sent again (an exporter's retry) updates its row in this run, which
    # keeps its key, and replaces what it counted; only this run's rows are read.
    known = {
        span_id: (pk, attributes)
        for span_id, pk, attributes in Span.objects.filter(
            run_id=run_id, span_id__in=[span.span_id for span in spans]
        ).values_list("span_id", "pk", "attributes")
    }
    # Model messages sent as log records (GenAI events) before their span.
    from_logs = log_messages_claim(
        tenant_id=tenant_id,
        run_id=run_id,
        trace_id=trace_id,
        span_ids=[span.span_id for span in spans],
    )
    for span in spans:
        attributes = redact_attributes(
            log_payloads_merge(span.attributes, from_logs.get(span.span_id, {}))
        )
        plain, refs = _payload_rows(tenant_id, attributes, payloads, encodings)
        ended_at = time_of(span.end_ns) if span.end_ns else None
        summary.add(
            root=not span.parent_span_id,
            status=span.status,
            attributes=attributes,
            ended_at=ended_at,
            previous=known[span.span_id][1] if span.span_id in known else None,
        )
        rows.append(
            Span(
                run_id=run_id,
                trace_id=trace_id,
                span_id=span.span_id,
                parent_span_id=span.parent_span_id,
                name=span.name[:300],
                kind=span.kind,
                status=span.status if span.end_ns else Span.Status.RUNNING,
                status_message=redact(span.status_message),
                started_at=time_of(span.start_ns),
                ended_at=ended_at,
                attributes=plain,
                events=redact(
                    [
                        {
                            "name": e["name"],
                            "time": time_of(e["time_unix_nano"]).isoformat()
                            if e["time_unix_nano"]
                            else None,
                            "attributes": e["attributes"],
                        }
                        for e in span.events
                    ]
                ),
                payloads=refs,
            )
        )
    SpanPayload.objects.bulk_create(list(payloads.values()), ignore_conflicts=True)
    ids = [row.span_id for row in rows]
    for row in rows:
        row.pk = known[row.span_id][0] if row.span_id in known else None
    Span.objects.bulk_update([r for r in rows if r.pk is not None], _UPDATED_FIELDS)
    Span.objects.bulk_create([r for r in rows if r.pk is None])
    # A new span whose children all came in this batch (or none yet) is known
    # whole from its event on: the UI lists its children from the stream.
    new = {row.span_id for row in rows if row.span_id not in known}
    earlier_children = set(
        Span.objects.filter(run_id=run_id, parent_span_id__in=new)
        .exclude(span_id__in=ids)
        .values_list("parent_span_id", flat=True)
    )
    first_seen = new - earlier_children
    stored = list(Span.objects.filter(run_id=run_id, span_id__in=ids))
    _append_events(RunIds(run_id, tenant_id), stored, first_seen)
    return summary


def _append_events(run: RunIds, spans: list[Span], first_seen: set[str]) -> None:
    """One `span.ended` event per span, consecutive seqs, one insert; announced
    by the last (a trace may hold more spans than a stream queues: the stream
    that sees the jump in seq fills the rest from the log at its own pace)."""
    if not spans:
        return
    events = []
    for span in spans:
        payload = span_event_payload(span)
        if span.span_id in first_seen:  # stored whole: no `span.started` first
            payload["first_event"] = True
        events.append(("span.ended", payload))
    run_events_append(run=run, events=events, announce="last")
