"""Whole-trace reads over a run's span tree that the browser cannot answer from
the spans it holds (a large run's children load on expand): search by name,
attribute value or status, the path to any span (deep links), and a subtree's
totals. A search reads its hits and then their ancestors level by level (a
trace is a few levels deep), never the whole run; a subtree's totals read
its spans level by level the same way.

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
    "SubtreeTotals",
    "span_search",
    "span_subtree_totals",
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


# What ordering and the exact match read of each candidate; a span's attributes
# only when the database matched it by them, and whole rows only for what is
# sent (a common word's 2,200 candidates as model instances with three decoded
# JSON columns took most of the search's time).
_TREE_FIELDS = ("pk", "span_id", "parent_span_id", "started_at")
_TEXT_FIELDS = ("name", "status", "status_message")


# A row's place in the tree: (start, pk) of each span from its root to it.
_Key = tuple[tuple[dt.datetime, int], ...]


@dataclass(frozen=True)
class _Row:
    pk: int
    span_id: str
    parent_span_id: str
    started_at: dt.datetime


def span_matches(span: Span, needle: str) -> bool:
    """A span matches by its name, a status equal to the text, its status message
    or any attribute value (not the attribute's key)."""
    return _text_matches(
        span.name, span.status, span.status_message, needle
    ) or _attributes_match(span.attributes, needle)


def _text_matches(name: str, status: str, status_message: str, needle: str) -> bool:
    return (
        needle in name.lower() or needle == status or needle in status_message.lower()
    )


def _attributes_match(attributes: Any, needle: str) -> bool:
    return any(needle in text.lower() for text in _values(attributes))


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
    offset: int = 0,
) -> SearchResult:
    """Spans of the run matching `text` (name, attribute value, status) and/or
    `status` ("error" also takes abandoned spans), or the one span `span_id`;
    each with the path from its root, so the browser can open it in place.
    The matches sent are `limit` from `offset` in row order; `count` is all of
    them (the browser asks for the first few, draws, then for the rest)."""
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
    candidates = spans.order_by("started_at", "pk").values_list(
        *_TREE_FIELDS, *_TEXT_FIELDS
    )[:MAX_CANDIDATES]
    found: list[_Row] = []
    by_attributes: list[_Row] = []
    read = 0
    for pk, sid, parent_id, started_at, name, code, message in candidates:
        read += 1
        row = _Row(pk, sid, parent_id, started_at)
        if not needle or _text_matches(name, code, message, needle):
            found.append(row)
        else:
            by_attributes.append(row)
    if by_attributes:
        attributes = dict(
            Span.objects.filter(pk__in=[r.pk for r in by_attributes]).values_list(
                "pk", "attributes"
            )
        )
        found += [
            r for r in by_attributes if _attributes_match(attributes[r.pk], needle)
        ]
    # The hits' ancestors, one level a query, until the roots.
    known: dict[str, _Row] = {r.span_id: r for r in found}
    wanted = {r.parent_span_id for r in found if r.parent_span_id} - known.keys()
    while wanted:
        level = [
            _Row(*values)
            for values in Span.objects.filter(
                run_id=run_id, span_id__in=wanted
            ).values_list(*_TREE_FIELDS)
        ]
        known.update((r.span_id, r) for r in level)
        wanted = {r.parent_span_id for r in level if r.parent_span_id} - known.keys()
    parent = {sid: r.parent_span_id for sid, r in known.items()}
    order_keys: dict[str, _Key] = {}
    # A parent's key, kept for its other children: a common word's 2,200 hits
    # have 200 parents, and walking each hit's path took a fifth of the search.
    parent_keys: dict[str, tuple[_Key, frozenset[str]]] = {}

    def row_order(row: _Row) -> _Key:
        # Depth first, siblings by start: the order of the tree's rows.
        key = order_keys.get(row.span_id)
        if key is None:
            up = row.parent_span_id
            above = parent_keys.get(up) if up in parent else ((), frozenset())
            if above is None:
                chain = [*_path(parent, up), up]
                above = (
                    tuple((known[i].started_at, known[i].pk) for i in chain),
                    frozenset(chain),
                )
                parent_keys[up] = above
            if row.span_id in above[1]:  # a cycle through this span
                chain = [*_path(parent, row.span_id), row.span_id]
                key = tuple((known[i].started_at, known[i].pk) for i in chain)
            else:
                key = (*above[0], (row.started_at, row.pk))
            order_keys[row.span_id] = key
        return key

    found.sort(key=row_order)
    kept = found[offset : offset + limit]
    paths = {r.span_id: _path(parent, r.span_id) for r in kept}
    kept_ids = {r.span_id for r in kept}
    on_paths = {a for path in paths.values() for a in path} - kept_ids
    ancestors = sorted((known[a] for a in on_paths), key=row_order)
    whole = Span.objects.in_bulk([r.pk for r in (*kept, *ancestors)])
    return SearchResult(
        matches=[whole[r.pk] for r in kept],
        count=len(found),
        truncated=len(found) > offset + limit or read == MAX_CANDIDATES,
        paths=paths,
        ancestors=[whole[r.pk] for r in ancestors],
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


# Parents asked for in one query when walking down a subtree (SQLite's bound
# on a statement's variables is 32,766).
_LEVEL_BATCH = 5000


def _subtree_rows(*, run_id: Any, span_id: str) -> list[Span]:
    """The span and everything under it, one level a query: a leaf's totals
    read two rows, not the run's whole tree."""
    fields = (
        "span_id", "parent_span_id", "name", "status", "started_at", "ended_at",
        "attributes",
    )  # fmt: skip
    rows = list(Span.objects.filter(run_id=run_id, span_id=span_id).only(*fields))
    seen = {span_id}
    level = [span_id]
    while level:
        found: list[Span] = []
        for at in range(0, len(level), _LEVEL_BATCH):
            batch = level[at : at + _LEVEL_BATCH]
            found += Span.objects.filter(run_id=run_id, parent_span_id__in=batch).only(
                *fields
            )
        # Ingested parents may form a cycle: each span once.
        found = [r for r in found if r.span_id not in seen]
        seen.update(r.span_id for r in found)
        rows += found
        level = [r.span_id for r in found]
    return rows


def span_subtree_totals(*, run_id: Any, span: Span, now: dt.datetime) -> SubtreeTotals:
    """Totals of `span` and every span under it. Token counts are taken from the
    spans that carry usage with none below them (a root's run totals would count
    every model call twice)."""
    rows = _subtree_rows(run_id=run_id, span_id=span.span_id)
    parent = {r.span_id: r.parent_span_id for r in rows}
    with_usage = {
        r.span_id
        for r in rows
        if "gen_ai.usage.input_tokens" in r.attributes
        or "gen_ai.usage.output_tokens" in r.attributes
    }
    usage_below: set[str] = set()
    for span_id in with_usage:
        usage_below.update(_path(parent, span_id))
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
