"""Storing ingested spans: one external run per trace id and tenant.

Ingest writes only spans of the caller's own tenant's external runs. A trace id
names one run within a tenant (`runs.Run`'s `one_run_per_trace`) and a span id
one span within its run, so another tenant's spans, with whatever ids, are never
read or written. A trace that is a native run's (the control plane records it
itself) is refused span by span and reported; its spans are never touched.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max

from controlplane.models import Tenant
from controlplane.services import audit_record
from runs.models import Run
from runs.services.external import (
    EXTERNAL_STOP_REASON,
    run_external_for_trace,
    run_external_update,
)
from tracing.ingest.otlp import OtlpSpan
from tracing.models import RunEvent, Span, SpanPayload
from tracing.redaction import redact, redact_attributes
from tracing.services import run_event_broadcast
from tracing.store import (
    PAYLOAD_KEYS,
    payload_encode,
    span_event_payload,
    telemetry_transaction,
)

__all__ = ["IngestResult", "ingest_spans"]


@dataclass
class IngestResult:
    spans: int  # stored (created or updated)
    runs: list[str]
    rejected: int = 0
    # One line per refused trace, for the OTLP partial-success error_message.
    errors: list[str] = field(default_factory=list)


def _time(ns: int) -> dt.datetime:
    # Whole microseconds from integers: a float of 10^18 ns loses them.
    seconds, rest = divmod(ns, 1_000_000_000)
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC) + dt.timedelta(
        microseconds=rest // 1000
    )


def _payload_rows(
    tenant: Tenant,
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
            SpanPayload(tenant=tenant, sha256=digest, size=size, content=text),
        )
        refs[key] = digest
    return plain, refs


def _message_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value[:20_000]
    return json.dumps(value, ensure_ascii=False, default=str)[:20_000]


_UPDATED_FIELDS = [
    "parent_span_id", "name", "kind", "status", "status_message",
    "started_at", "ended_at", "attributes", "events", "payloads",
]  # fmt: skip


def _store_trace(
    tenant: Tenant, trace_id: str, spans: list[OtlpSpan]
) -> tuple[Run, RunEvent | None]:
    """Create or update the trace's spans in the tenant's external run for it."""
    first = min(spans, key=lambda s: s.start_ns)
    run = run_external_for_trace(
        tenant=tenant,
        trace_id=trace_id,
        service=first.service,
        started_at=_time(first.start_ns),
    )
    payloads: dict[str, SpanPayload] = {}
    encodings: dict[str, tuple[str, str, int]] = {}  # the same prompt, once
    rows: list[Span] = []
    input_tokens = output_tokens = 0
    failed = False
    root_input = root_output = None
    for span in spans:
        attributes = redact_attributes(span.attributes)
        plain, refs = _payload_rows(tenant, attributes, payloads, encodings)
        if plain.get("gen_ai.operation.name") == "chat":
            # Checked whole numbers in range (tracing.ingest.otlp).
            input_tokens += plain.get("gen_ai.usage.input_tokens", 0)
            output_tokens += plain.get("gen_ai.usage.output_tokens", 0)
        if not span.parent_span_id:
            failed = failed or span.status == "error"
            root_input = attributes.get("gen_ai.input.messages", root_input)
            root_output = attributes.get("gen_ai.output.messages", root_output)
        rows.append(
            Span(
                run=run,
                trace_id=trace_id,
                span_id=span.span_id,
                parent_span_id=span.parent_span_id,
                name=span.name[:300],
                kind=span.kind,
                status=span.status if span.end_ns else Span.Status.RUNNING,
                status_message=redact(span.status_message),
                started_at=_time(span.start_ns),
                ended_at=_time(span.end_ns) if span.end_ns else None,
                attributes=plain,
                events=redact(
                    [
                        {
                            "name": e["name"],
                            "time": _time(e["time_unix_nano"]).isoformat()
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
    # A span sent again (an exporter's retry) updates its row in this run, which
    # keeps its key; only this run's rows are looked at.
    ids = [row.span_id for row in rows]
    known = dict(
        Span.objects.filter(run=run, span_id__in=ids).values_list("span_id", "pk")
    )
    for row in rows:
        row.pk = known.get(row.span_id)
    Span.objects.bulk_update([r for r in rows if r.pk is not None], _UPDATED_FIELDS)
    Span.objects.bulk_create([r for r in rows if r.pk is None])
    # A new span whose children all came in this batch (or none yet) is known
    # whole from its event on: the UI lists its children from the stream.
    new = {row.span_id for row in rows if row.span_id not in known}
    earlier_children = set(
        Span.objects.filter(run=run, parent_span_id__in=new)
        .exclude(span_id__in=ids)
        .values_list("parent_span_id", flat=True)
    )
    first_seen = new - earlier_children
    stored = list(Span.objects.filter(run=run, span_id__in=ids))
    last = _append_events(run, stored, first_seen)
    run_external_update(
        run=run,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        failed=failed,
        input=_message_text(root_input),
        final_answer=_message_text(root_output),
        finished_at=max((_time(s.end_ns) for s in spans if s.end_ns), default=None),
    )
    return run, last


def _append_events(
    run: Run, spans: list[Span], first_seen: set[str]
) -> RunEvent | None:
    """One `span.ended` event per span, consecutive seqs, one insert."""
    if not spans:
        return None
    payloads = []
    for span in spans:
        payload = span_event_payload(span)
        if span.span_id in first_seen:  # stored whole: no `span.started` first
            payload["first_event"] = True
        payloads.append(payload)
    for _ in range(20):
        last = RunEvent.objects.filter(run=run).aggregate(m=Max("seq"))["m"] or 0
        events = [
            RunEvent(run=run, seq=last + offset, type="span.ended", payload=payload)
            for offset, payload in enumerate(payloads, start=1)
        ]
        try:
            with transaction.atomic():
                RunEvent.objects.bulk_create(events)
        except IntegrityError:
            continue
        return RunEvent.objects.get(run=run, seq=last + len(spans))
    raise IntegrityError(f"run {run.id}: could not take {len(spans)} seqs")


def ingest_spans(*, tenant: Tenant, user: Any, spans: list[OtlpSpan]) -> IngestResult:
    """Store checked spans, one external run per trace id of `tenant`; the spans
    of a trace that is one of the tenant's native runs are refused (counted and
    named in the result, with an audit entry), all the others stored together."""
    by_trace: dict[str, dict[str, OtlpSpan]] = defaultdict(dict)
    for span in spans:
        by_trace[span.trace_id][span.span_id] = span  # a repeated span: the last

    native = dict(
        Run.objects.filter(tenant=tenant, trace_id__in=list(by_trace))
        .exclude(stop_reason=EXTERNAL_STOP_REASON)
        .values_list("trace_id", "id")
    )
    result = IngestResult(spans=0, runs=[])
    with telemetry_transaction():
        for trace_id, members in by_trace.items():
            if trace_id in native:
                result.rejected += len(members)
                result.errors.append(
                    f"trace {trace_id} is a run of this control plane; its spans "
                    "are recorded by the control plane and not accepted over OTLP"
                )
                audit_record(
                    tenant=tenant,
                    actor=user,
                    action="otlp.spans_rejected",
                    object_type="run",
                    object_id=str(native[trace_id]),
                    after={"trace_id": trace_id, "span_ids": sorted(members)[:100],
                           "rejected": len(members)},
                )  # fmt: skip
                continue
            run, last = _store_trace(tenant, trace_id, list(members.values()))
            result.spans += len(members)
            result.runs.append(str(run.id))
            if last is not None:
                # One broadcast per trace: a stream that sees the jump in seq
                # fills the rest from the log.
                event = last
                transaction.on_commit(
                    lambda event=event: run_event_broadcast(  # type: ignore[misc]
                        event=event, tenant_id=tenant.id
                    )
                )
    return result
