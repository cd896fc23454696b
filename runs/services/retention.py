"""Deleting runs: one run through the API, and a tenant's expired runs by beat
(with the end users' memory files nobody wrote to since the cutoff, and the
eval trials' shop worlds no run acts in any more).

A run goes with everything recorded about it: its steps, tool calls, approval
requests and their decisions, spans, run events, and the span payloads no other
span of the tenant still points at (payloads are stored once per tenant and
content, so two runs that sent the same prompt share one). The budget ledger and
budget grants are billing records and are kept; they name the run by id only.
Only a terminal run is ever deleted: a status that ended never changes back, so
a run found terminal may be deleted without holding a lock on it.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Max, Q, QuerySet
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest
from controlplane.models import Tenant
from controlplane.services import audit_record
from runs.memory import memory_retention_purge
from runs.models import Run, Step, ToolCall
from runs.services.lifecycle import RunConflict
from shop.services import shop_worlds_purge
from tracing.models import RunEvent, Span, SpanPayload

__all__ = [
    "DeletedRows",
    "RetentionReport",
    "retention_sweep",
    "run_delete",
    "tenant_retention_apply",
    "tenant_retention_days",
    "tenant_retention_set",
]

# A pass deletes at most this many batches per tenant; the rest waits for the
# next pass, so one pass stays well inside the task's time limit.
MAX_BATCHES_PER_PASS = 20


@dataclass
class DeletedRows:
    runs: int = 0
    steps: int = 0
    tool_calls: int = 0
    approvals: int = 0
    approval_decisions: int = 0
    spans: int = 0
    span_payloads: int = 0
    events: int = 0

    def add(self, other: DeletedRows) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class RetentionReport:
    tenant_id: uuid.UUID
    retention_days: int
    cutoff: dt.datetime
    batches: int = 0
    deleted: DeletedRows = field(default_factory=DeletedRows)
    # Expired runs were left for the next pass (the pass's batch cap or time).
    more: bool = False
    # End users' memory files not written since the cutoff (runs.memory).
    memory_files: int = 0
    # Eval trials' shop worlds made before the cutoff that no run acts in.
    shop_worlds: int = 0


def _digests(refs: Iterable[dict[str, Any]]) -> set[str]:
    return {v for r in refs if isinstance(r, dict) for v in r.values() if v}


def _chunks(items: list[Any], size: int = 500) -> Iterator[list[Any]]:
    """Keys in lists short enough for any database's limit on query parameters."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _spans_of_tenant(tenant_id: uuid.UUID) -> QuerySet[Span]:
    return Span.objects.filter(run__tenant_id=tenant_id)


def _orphaned_digests(
    *, tenant_id: uuid.UUID, run_ids: set[uuid.UUID]
) -> tuple[set[str], int]:
    """Payload digests the spans of `run_ids` use and no other span of the tenant
    does, and the highest span key seen (spans stored later are checked again
    when the payloads are deleted). A read, outside any write transaction."""
    high_water = Span.objects.aggregate(m=Max("pk"))["m"] or 0
    deleting: set[str] = set()
    for chunk in _chunks(sorted(run_ids)):
        deleting |= _digests(
            Span.objects.filter(run_id__in=chunk).values_list("payloads", flat=True)
        )
    if not deleting:
        return set(), high_water
    rows = (
        _spans_of_tenant(tenant_id)
        .filter(pk__lte=high_water)
        .values_list("run_id", "payloads")
        .iterator(chunk_size=2000)
    )
    for run_id, refs in rows:
        if run_id not in run_ids and isinstance(refs, dict):
            deleting.difference_update(refs.values())
            if not deleting:
                break
    return deleting, high_water


def _rows_delete(
    *,
    tenant_id: uuid.UUID,
    run_ids: list[uuid.UUID],
    orphans: set[str],
    high_water: int,
) -> DeletedRows:
    """Delete the terminal runs among `run_ids` and their rows; the caller holds
    the transaction. Children first, so each delete is one plain statement."""
    ids = list(
        Run.objects.filter(
            tenant_id=tenant_id, id__in=run_ids, status__in=Run.TERMINAL
        ).values_list("id", flat=True)
    )
    deleted = DeletedRows()
    if not ids:
        return deleted
    mine = orphans & _digests(
        Span.objects.filter(run_id__in=ids).values_list("payloads", flat=True)
    )
    if mine:
        # A span stored since the scan may reuse a payload (same content).
        mine -= _digests(
            _spans_of_tenant(tenant_id)
            .filter(pk__gt=high_water)
            .values_list("payloads", flat=True)
        )
    deleted.events = _count(RunEvent.objects.filter(run_id__in=ids))
    deleted.spans = _count(Span.objects.filter(run_id__in=ids))
    deleted.span_payloads = sum(
        _count(SpanPayload.objects.filter(tenant_id=tenant_id, sha256__in=chunk))
        for chunk in _chunks(sorted(mine))
    )
    deleted.approval_decisions = _count(
        ApprovalDecision.objects.filter(request__run_id__in=ids)
    )
    deleted.approvals = _count(ApprovalRequest.objects.filter(run_id__in=ids))
    deleted.tool_calls = _count(ToolCall.objects.filter(run_id__in=ids))
    deleted.steps = _count(Step.objects.filter(run_id__in=ids))
    deleted.runs = _count(Run.objects.filter(id__in=ids))
    return deleted


def _count(query: QuerySet[Any]) -> int:
    """Rows of the query's own model deleted (its children are already gone)."""
    return query.delete()[1].get(query.model._meta.label, 0)


def run_delete(
    *, run: Run, actor: User | None, remote_addr: str | None = None
) -> DeletedRows:
    """Delete one terminal run and its rows, audited with the counts; a run that
    has not ended is a conflict (cancel it first) and nothing is deleted, a run
    deleted meanwhile is Run.DoesNotExist."""
    if not run.is_terminal:
        raise RunConflict(
            run, f"the run is {run.status}; cancel it first, then delete it"
        )
    orphans, high_water = _orphaned_digests(tenant_id=run.tenant_id, run_ids={run.id})
    with transaction.atomic():
        deleted = _rows_delete(
            tenant_id=run.tenant_id,
            run_ids=[run.id],
            orphans=orphans,
            high_water=high_water,
        )
        if not deleted.runs:  # deleted meanwhile by another request or beat
            raise Run.DoesNotExist(f"run {run.id} no longer exists")
        audit_record(
            tenant=run.tenant,
            actor=actor,
            action="run.delete",
            object_type="run",
            object_id=str(run.id),
            before={
                "status": run.status,
                "agent": run.agent.slug,
                "created_at": run.created_at.isoformat(),
            },
            after={"deleted": deleted.as_dict()},
            remote_addr=remote_addr,
        )
    return deleted


def tenant_retention_days(tenant: Tenant) -> int | None:
    """The tenant's own retention, else the deployment's; None: keep forever."""
    if tenant.retention_days:
        return tenant.retention_days
    return settings.DATA_RETENTION_DAYS or None


@transaction.atomic
def tenant_retention_set(
    *,
    tenant: Tenant,
    retention_days: int | None,
    actor: User | None,
    remote_addr: str | None = None,
) -> Tenant:
    """Set (or clear, with None) the tenant's retention in days, audited."""
    if retention_days is not None and retention_days < 1:
        raise ValueError("retention_days must be at least 1, or null")
    before = (
        Tenant.objects.filter(id=tenant.id)
        .values_list("retention_days", flat=True)
        .get()
    )
    Tenant.objects.filter(id=tenant.id).update(retention_days=retention_days)
    audit_record(
        tenant=tenant,
        actor=actor,
        action="tenant.retention_set",
        object_type="tenant",
        object_id=str(tenant.id),
        before={"retention_days": before},
        after={"retention_days": retention_days},
        remote_addr=remote_addr,
    )
    tenant.retention_days = retention_days
    return tenant


def _expired_runs(tenant: Tenant, cutoff: dt.datetime) -> QuerySet[Run]:
    # Old by creation and by end: a run that waited weeks for a human and ended
    # yesterday is kept as long as a run that ended yesterday.
    return Run.objects.filter(
        tenant=tenant, status__in=Run.TERMINAL, created_at__lt=cutoff
    ).filter(Q(finished_at__isnull=True) | Q(finished_at__lt=cutoff))


def tenant_retention_apply(
    *,
    tenant: Tenant,
    retention_days: int,
    now: dt.datetime | None = None,
    batch_size: int | None = None,
    deadline: float | None = None,
) -> RetentionReport:
    """Delete the tenant's terminal runs older than `retention_days`, `batch_size`
    runs per transaction (so no transaction holds the database long), and record
    one audit entry with the counts when anything was deleted."""
    size = batch_size or settings.DATA_RETENTION_BATCH_SIZE
    cutoff = (now or timezone.now()) - dt.timedelta(days=retention_days)
    report = RetentionReport(
        tenant_id=tenant.id, retention_days=retention_days, cutoff=cutoff
    )
    candidates = list(
        _expired_runs(tenant, cutoff)
        .order_by("created_at")
        .values_list("id", flat=True)[: size * MAX_BATCHES_PER_PASS + 1]
    )
    report.more = len(candidates) > size * MAX_BATCHES_PER_PASS
    candidates = candidates[: size * MAX_BATCHES_PER_PASS]
    orphans, high_water = _orphaned_digests(
        tenant_id=tenant.id, run_ids=set(candidates)
    )
    for start in range(0, len(candidates), size):
        if deadline is not None and time.monotonic() > deadline:
            report.more = True
            break
        with transaction.atomic():
            report.deleted.add(
                _rows_delete(
                    tenant_id=tenant.id,
                    run_ids=candidates[start : start + size],
                    orphans=orphans,
                    high_water=high_water,
                )
            )
        report.batches += 1
    # Memory outlives the runs that wrote it, but not the tenant's retention:
    # a file nobody wrote to since the cutoff goes (docs/memory.md).
    report.memory_files = memory_retention_purge(tenant=tenant, cutoff=cutoff)
    # An eval trial's world outlives its run only until the run is gone (a
    # branch of the run acts in it too: it is kept while one is).
    report.shop_worlds = shop_worlds_purge(
        tenant=tenant,
        made_before=cutoff,
        in_use=Run.objects.filter(tenant=tenant, world_id__isnull=False).values(
            "world_id"
        ),
    )
    if report.deleted.runs or report.memory_files or report.shop_worlds:
        audit_record(
            tenant=tenant,
            actor=None,
            action="data.retention",
            object_type="tenant",
            object_id=str(tenant.id),
            after={
                "retention_days": retention_days,
                "cutoff": cutoff.isoformat(),
                "batches": report.batches,
                "more": report.more,
                "deleted": report.deleted.as_dict(),
                "memory_files": report.memory_files,
                "shop_worlds": report.shop_worlds,
            },
        )
    return report


def retention_sweep(
    *, now: dt.datetime | None = None, batch_size: int | None = None
) -> list[RetentionReport]:
    """One pass over every tenant whose retention is set (its own or the
    deployment's). It stops starting batches after half the task time limit."""
    deadline = time.monotonic() + settings.CELERY_TASK_TIME_LIMIT / 2
    tenants = Tenant.objects.order_by("created_at")
    if not settings.DATA_RETENTION_DAYS:
        tenants = tenants.filter(retention_days__isnull=False)
    reports = []
    for tenant in tenants:
        days = tenant_retention_days(tenant)
        if days is None:
            continue
        reports.append(
            tenant_retention_apply(
                tenant=tenant,
                retention_days=days,
                now=now,
                batch_size=batch_size,
                deadline=deadline,
            )
        )
    return reports
