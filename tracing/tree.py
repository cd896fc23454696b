"""Whole-trace reads over a run's span tree that the browser cannot answer from
the spans it holds (a large run's children load on expand): search by name,
attribute value or status, the path to any span (deep links), and a subtree's
totals. A search reads its hits and then their ancestors level by level (a
trace is a few levels deep), never the whole run; a subtree reads the run's
(span_id, parent) pairs to find what is under the span.

Runs are named by id: the caller has asked whether the run is the tenant's
(`runs.selectors.run_for_tenant`) before these are called."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q, TextField
from django.db.models.functions import Cast

from tracing.models import Span

__all__ = [
    "SearchResult",
    "Skeleton",
    "SubtreeTotals",
    "span_search",
    "span_subtree_totals",
    "trace_skeleton",
]

# A query matching more spans than this says so (the browser shows "first N").
MAX_MATCHES = 1000
# Rows the database prefilter may return before the exact check in Python.
MAX_CANDIDATES = 20_000
ERROR_STATUSES = (Span.Status.ERROR, Span.Status.ABANDONED)


def _path(parent: dict[str, str], span_id: str) -> list[str]:
    """Ancestors of `span_id` known in `parent`, root first (ingested parents
    may form a cycle: each at most once)."""
    path: list[str] = []
    seen = {span_id}
    at = parent.get(span_id, "")
    while at and at in parent and at not in seen:
        seen.add(at)
        path.append(at)
        at = parent[at]
    path.reverse()
    return path


@dataclass
class Skeleton:
    """The run's tree without its data: the parent of every span."""

    parent: dict[str, str]

    def path(self, span_id: str) -> list[str]:
        return _path(self.parent, span_id)

    def descendants(self, span_id: str) -> list[str]:
        children: dict[str, list[str]] = {}
        for child, parent in self.parent.items():
            if parent:
                children.setdefault(parent, []).append(child)
        found: list[str] = []
        seen = {span_id}
        stack = [span_id]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in seen:
                    seen.add(child)
                    found.append(child)
                    stack.append(child)
        return found


def trace_skeleton(*, run_id: Any) -> Skeleton:
    rows = Span.objects.filter(run_id=run_id).values_list("span_id", "parent_span_id")
    return Skeleton(parent=dict(rows))


def _values(value: Any) -> Iterable[str]:
    """The scalar values inside an attribute (lists and nested maps flattened)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _values(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _values(item)
    elif value is not None:
        yield str(value)


_SEARCH_FIELDS = (
    "pk",
    "span_id",
    "parent_span_id",
    "name",
    "status",
    "status_message",
    "attributes",
    "started_at",
)


def span_matches(span: Span, needle: str) -> bool:
    """A span matches by its name, a status equal to the text, its status message
    or any attribute value (not the attribute's key)."""
    if needle in span.name.lower() or needle == span.status:
        return True
    if needle in span.status_message.lower():
        return True
    return any(needle in text.lower() for text in _values(span.attributes))


@dataclass
class SearchResult:
    matches: list[Span]  # in the tree's row order
    count: int
    truncated: bool
    paths: dict[str, list[str]] = field(default_factory=dict)  # match -> ancestors
    ancestors: list[Span] = field(default_factory=list)  # every path's spans


def span_search(
    *,
    run_id: Any,
    text: str = "",
    status: str = "",
    span_id: str = "",
    limit: int = MAX_MATCHES,
) -> SearchResult:
    """Spans of the run matching `text` (name, attribute value, status) and/or
    `status` ("error" also takes abandoned spans), or the one span `span_id`;
    each with the path from its root, so the browser can open it in place."""
    spans = Span.objects.filter(run_id=run_id)
    needle = text.strip().lower()
    if span_id:
        spans = spans.filter(span_id=span_id)
    if status == Span.Status.ERROR:
        spans = spans.filter(status__in=ERROR_STATUSES)
    elif status:
        spans = spans.filter(status=status)
    if needle:
        # The database narrows by text (JSON as text also holds keys, and is
        # escaped); the exact rule is applied to what it returns.
        spans = spans.annotate(attrs_text=Cast("attributes", TextField())).filter(
            Q(name__icontains=needle)
            | Q(status=needle)
            | Q(status_message__icontains=needle)
            | Q(attrs_text__icontains=needle)
        )
    # What matching and ordering read; the rows sent are read whole at the end
    # (a common word's 2,200 candidates decoded three JSON columns each).
    candidates = list(
        spans.order_by("started_at", "pk").only(*_SEARCH_FIELDS)[:MAX_CANDIDATES]
    )
    found = [s for s in candidates if not needle or span_matches(s, needle)]
    # The hits' ancestors, one level a query, until the roots.
    known: dict[str, Span] = {s.span_id: s for s in found}
    wanted = {s.parent_span_id for s in found if s.parent_span_id} - known.keys()
    while wanted:
        level = list(
            Span.objects.filter(run_id=run_id, span_id__in=wanted).only(*_SEARCH_FIELDS)
        )
        known.update((s.span_id, s) for s in level)
        wanted = {s.parent_span_id for s in level if s.parent_span_id} - known.keys()
    parent = {span_id: s.parent_span_id for span_id, s in known.items()}

    def row_order(span: Span) -> tuple[tuple[dt.datetime, int], ...]:
        # Depth first, siblings by start: the order of the tree's rows.
        chain = [*_path(parent, span.span_id), span.span_id]
        return tuple((known[i].started_at, known[i].pk) for i in chain)

    found.sort(key=row_order)
    kept = found[:limit]
    paths = {s.span_id: _path(parent, s.span_id) for s in kept}
    kept_ids = {s.span_id for s in kept}
    on_paths = {a for path in paths.values() for a in path} - kept_ids
    ancestors = sorted((known[a] for a in on_paths), key=row_order)
    whole = Span.objects.in_bulk([s.pk for s in (*kept, *ancestors)])
    return SearchResult(
        matches=[whole[s.pk] for s in kept],
        count=len(found),
        truncated=len(found) > limit or len(candidates) == MAX_CANDIDATES,
        paths=paths,
        ancestors=[whole[s.pk] for s in ancestors],
    )


@dataclass
class SubtreeTotals:
    spans: int = 0  # the span and everything under it
    errors: int = 0
    running: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    model_calls: int = 0
    model_ms: float = 0.0  # time inside model calls, summed
    tool_calls: int = 0
    tool_ms: float = 0.0
    waiting_ms: float = 0.0  # time approvals waited for a person
    cost_attributes: float = 0.0  # costs carried on spans (ingested traces)
    step_indexes: set[int] = field(default_factory=set)  # native steps (priced)

    def as_dict(self) -> dict[str, Any]:
        return {
            "spans": self.spans,
            "errors": self.errors,
            "running": self.running,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "model_calls": self.model_calls,
            "model_ms": round(self.model_ms, 3),
            "tool_calls": self.tool_calls,
            "tool_ms": round(self.tool_ms, 3),
            "waiting_ms": round(self.waiting_ms, 3),
        }


COST_KEYS = ("cp.cost", "cp.usage.cost", "gen_ai.usage.cost", "llm.cost.total")


def _ms(span: Span, now: dt.datetime) -> float:
    return ((span.ended_at or now) - span.started_at).total_seconds() * 1000


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def span_subtree_totals(*, run_id: Any, span: Span, now: dt.datetime) -> SubtreeTotals:
    """Totals of `span` and every span under it. Token counts are taken from the
    spans that carry usage with none below them (a root's run totals would count
    every model call twice)."""
    skeleton = trace_skeleton(run_id=run_id)
    ids = [span.span_id, *skeleton.descendants(span.span_id)]
    rows = list(
        Span.objects.filter(run_id=run_id, span_id__in=ids).only(
            "span_id", "parent_span_id", "name", "status", "started_at", "ended_at",
            "attributes",
        )
    )  # fmt: skip
    with_usage = {
        r.span_id
        for r in rows
        if "gen_ai.usage.input_tokens" in r.attributes
        or "gen_ai.usage.output_tokens" in r.attributes
    }
    usage_below: set[str] = set()
    for span_id in with_usage:
        usage_below.update(skeleton.path(span_id))
    totals = SubtreeTotals(spans=len(rows))
    for row in rows:
        a = row.attributes
        if row.status in ERROR_STATUSES:
            totals.errors += 1
        if row.status == Span.Status.RUNNING:
            totals.running += 1
        if row.span_id in with_usage and row.span_id not in usage_below:
            totals.input_tokens += int(_number(a.get("gen_ai.usage.input_tokens")))
            totals.output_tokens += int(_number(a.get("gen_ai.usage.output_tokens")))
        operation = a.get("gen_ai.operation.name") or a.get("openinference.span.kind")
        if operation in ("chat", "text_completion", "generate_content", "LLM"):
            totals.model_calls += 1
            totals.model_ms += _ms(row, now)
        elif operation in ("execute_tool", "TOOL") or row.name.startswith(
            "execute_tool"
        ):
            totals.tool_calls += 1
            totals.tool_ms += _ms(row, now)
        if row.name.startswith("approval"):
            totals.waiting_ms += _ms(row, now)
        for key in COST_KEYS:
            if key in a:
                totals.cost_attributes += _number(a[key])
                break
        index = a.get("cp.step.index")
        if isinstance(index, int) and row.name.startswith("step"):
            totals.step_indexes.add(index)
    return totals
