"""GenAI messages that arrived as log records, stored and put on their spans.

The messages are kept (`SpanLogMessage`, redacted) and a span's payload is put
together from all of them each time: the log records of one model call may come
in several exports, before or after the span, and the span may be sent again (an
exporter's retry rebuilds its row from its own attributes). A payload the span
carries itself (an instrumentation that records content on the span too) wins;
those filled in from log records are named in the span's attribute
`cp.ingest.payloads_from_logs`.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

from django.db.models import Q
from django.utils import timezone

from controlplane.redaction import redact
from tracing.ingest.logs import OUTPUT, LogMessage
from tracing.ingest.mapping import output_finish_reasons
from tracing.ingest.otlp import time_of
from tracing.models import Span, SpanLogMessage
from tracing.payloads import payload_store
from tracing.services import RunIds, run_events_append
from tracing.store import span_event_payload

__all__ = [
    "FROM_LOGS",
    "log_messages_claim",
    "log_messages_expire",
    "log_messages_store",
    "log_payloads_merge",
    "span_log_messages_apply",
]

FROM_LOGS = "cp.ingest.payloads_from_logs"
FINISH_REASONS = "gen_ai.response.finish_reasons"


def _finish_reasons(attributes: dict[str, Any], output: Any) -> None:
    """A span that does not name its finish reasons takes its output messages'
    (openai-v2's streamed calls put them only on the `gen_ai.choice` events)."""
    if FINISH_REASONS not in attributes:
        reasons = output_finish_reasons(output)
        if reasons:
            attributes[FINISH_REASONS] = reasons


def log_messages_store(
    *, tenant_id: Any, run_id: Any | None, messages: list[LogMessage]
) -> None:
    """Keep the messages (redacted); `run_id` None while the trace has no run."""
    SpanLogMessage.objects.bulk_create(
        [
            SpanLogMessage(
                tenant_id=tenant_id,
                run_id=run_id,
                trace_id=message.trace_id,
                span_id=message.span_id,
                key=message.key,
                whole=message.whole,
                emitted_at=time_of(message.time_ns),
                content=redact(message.content),
            )
            for message in messages
        ]
    )


def _payloads(
    tenant_id: Any, trace_id: str, span_ids: list[str]
) -> dict[str, dict[str, Any]]:
    """Per span id, its payloads as the stored messages make them: a whole one
    (the last sent) or the messages in the order they were emitted."""
    rows = SpanLogMessage.objects.filter(
        tenant_id=tenant_id, trace_id=trace_id, span_id__in=span_ids
    ).order_by("emitted_at", "id")
    parts: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    whole: dict[str, dict[str, Any]] = defaultdict(dict)
    for row in rows:
        if row.whole:
            whole[row.span_id][row.key] = row.content
        else:
            parts[row.span_id][row.key].append(row.content)
    out: dict[str, dict[str, Any]] = {}
    for span_id in set(parts) | set(whole):
        out[span_id] = {**parts[span_id], **whole[span_id]}
    return out


def log_messages_claim(
    *, tenant_id: Any, run_id: Any, trace_id: str, span_ids: list[str]
) -> dict[str, dict[str, Any]]:
    """For spans about to be stored in `run_id`: the payloads their log records
    make, by span id; the trace's messages that waited for a run now belong to
    it. The caller holds the transaction."""
    SpanLogMessage.objects.filter(
        tenant_id=tenant_id, trace_id=trace_id, run__isnull=True
    ).update(run_id=run_id)
    return _payloads(tenant_id, trace_id, span_ids)


def log_payloads_merge(
    attributes: dict[str, Any], payloads: dict[str, Any]
) -> dict[str, Any]:
    """The span's attributes with the payloads from log records it lacks."""
    if not payloads:
        return attributes
    merged = dict(attributes)
    filled = [key for key in payloads if key not in attributes]
    for key in filled:
        merged[key] = payloads[key]
    if filled:
        merged[FROM_LOGS] = sorted(filled)
    if OUTPUT in filled:
        _finish_reasons(merged, payloads[OUTPUT])
    return merged


def span_log_messages_apply(
    *, tenant_id: Any, run_id: Any, trace_id: str, span_ids: list[str]
) -> int:
    """Put the messages on the spans of `run_id` already stored (log records
    that came after their span): payloads set, one `span.ended` event each.
    Returns how many spans changed. The caller holds the transaction."""
    spans = list(
        Span.objects.select_for_update().filter(run_id=run_id, span_id__in=span_ids)
    )
    if not spans:
        return 0
    payloads = _payloads(tenant_id, trace_id, [span.span_id for span in spans])
    changed: list[Span] = []
    for span in spans:
        filled = set(span.attributes.get(FROM_LOGS) or [])
        before = dict(span.payloads)
        for key, value in payloads.get(span.span_id, {}).items():
            if key in span.payloads and key not in filled:
                continue  # the span's own content wins
            span.payloads[key] = payload_store(tenant_id=tenant_id, value=value)
            filled.add(key)
        if span.payloads != before:
            span.attributes = {**span.attributes, FROM_LOGS: sorted(filled)}
            if OUTPUT in filled:
                _finish_reasons(span.attributes, payloads[span.span_id][OUTPUT])
            changed.append(span)
    Span.objects.bulk_update(changed, ["attributes", "payloads"])
    if changed:
        run_events_append(
            run=RunIds(run_id, tenant_id),
            events=[("span.ended", span_event_payload(span)) for span in changed],
            announce="last",
        )
    return len(changed)


def log_messages_expire(*, older_than: dt.timedelta) -> int:
    """Drop messages whose trace never arrived; return how many."""
    cutoff = timezone.now() - older_than
    deleted, _ = SpanLogMessage.objects.filter(
        Q(run__isnull=True) & Q(received_at__lt=cutoff)
    ).delete()
    return deleted
