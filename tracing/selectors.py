"""Reads of spans and run events, scoped to the caller's tenant.

Runs are named by id: whether a run is the tenant's is the runs app's question
(`runs.selectors.run_for_tenant`), asked before these are."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from django.db.models import Exists, OuterRef, QuerySet

from controlplane.models import Tenant
from tracing.models import RunEvent, Span, SpanPayload
from tracing.services import TENANT_EVENT_PREFIXES

__all__ = [
    "run_events_after",
    "run_spans_with_payloads",
    "span_children",
    "span_for_tenant",
    "span_payloads",
    "tenant_events_after",
]


def run_events_after(*, run_id: Any, after_seq: int) -> QuerySet[RunEvent]:
    return RunEvent.objects.filter(run_id=run_id, seq__gt=after_seq).order_by("seq")


def tenant_events_after(*, tenant: Tenant, after_id: int) -> QuerySet[RunEvent]:
    query = RunEvent.objects.none()
    for prefix in TENANT_EVENT_PREFIXES:
        query = query | RunEvent.objects.filter(type__startswith=prefix)
    return query.filter(run__tenant=tenant, id__gt=after_id).order_by("id")


if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

    class _HasChildren(TypedDict):
        has_children: bool

    SpanWithChildren = WithAnnotations[Span, _HasChildren]


def span_children(*, run_id: Any, parent_span_id: str) -> QuerySet[SpanWithChildren]:
    """Spans of the run whose parent is `parent_span_id` ("" for the roots),
    each with `has_children` (one index probe a row): the browser then knows a
    leaf as one, so a trace opened whole is searched without the server."""
    below = Span.objects.filter(
        run_id=OuterRef("run_id"), parent_span_id=OuterRef("span_id")
    )
    return (
        Span.objects.filter(run_id=run_id, parent_span_id=parent_span_id)
        .annotate(has_children=Exists(below))
        .order_by("started_at", "id")
    )


def span_for_tenant(*, tenant: Tenant, span_pk: int) -> Span | None:
    return Span.objects.filter(run__tenant=tenant, pk=span_pk).first()


def span_payloads(*, tenant: Tenant, span: Span) -> dict[str, Any]:
    """The span's payload bodies by attribute name (JSON text as stored)."""
    rows = SpanPayload.objects.filter(
        tenant=tenant, sha256__in=list(span.payloads.values())
    )
    by_hash = {row.sha256: row for row in rows}
    return {
        name: by_hash[digest].content
        for name, digest in span.payloads.items()
        if digest in by_hash
    }


def run_spans_with_payloads(
    *, tenant: Tenant, run_id: Any
) -> list[tuple[Span, dict[str, str]]]:
    """Every span of the run, oldest first, with its payload bodies by attribute
    name (JSON text as stored); payloads are read in chunks of keys."""
    spans = list(
        Span.objects.filter(run_id=run_id, run__tenant=tenant).order_by(
            "started_at", "id"
        )
    )
    digests = sorted({d for span in spans for d in span.payloads.values()})
    texts: dict[str, str] = {}
    for start in range(0, len(digests), 500):
        texts.update(
            SpanPayload.objects.filter(
                tenant=tenant, sha256__in=digests[start : start + 500]
            ).values_list("sha256", "content")
        )
    return [
        (
            span,
            {name: texts[d] for name, d in span.payloads.items() if d in texts},
        )
        for span in spans
    ]
