"""Run gauges read from the database when /metrics is scraped (all tenants: the
endpoint is for operators). Registered in settings.METRICS_COLLECTORS."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from approvals.models import ApprovalRequest
from runs.models import Run

_OPEN = (
    Run.Status.QUEUED,
    Run.Status.RUNNING,
    Run.Status.WAITING_APPROVAL,
    Run.Status.WAITING_INPUT,
    Run.Status.WAITING_SUBAGENTS,
)


def run_gauges() -> Iterator[Metric]:
    now = timezone.now()
    counts = dict(
        Run.objects.filter(status__in=_OPEN)
        .order_by()
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    runs = GaugeMetricFamily(
        "controlplane_runs_open", "Runs not yet ended, by status.", labels=["status"]
    )
    for status in _OPEN:
        runs.add_metric([str(status)], counts.get(status, 0))
    yield runs

    waiting = GaugeMetricFamily(
        "controlplane_runs_waiting_for_human",
        "Runs waiting for an approval, a budget extension decision or an answer.",
    )
    waiting.add_metric(
        [],
        counts.get(Run.Status.WAITING_APPROVAL, 0)
        + counts.get(Run.Status.WAITING_INPUT, 0),
    )
    yield waiting

    # A queued run's updated_at is when it was last handed to the queue.
    oldest_queued = Run.objects.filter(status=Run.Status.QUEUED).aggregate(
        at=Min("updated_at")
    )["at"]
    age = GaugeMetricFamily(
        "controlplane_queue_oldest_age_seconds",
        "Age of the oldest queued run (0 when none waits).",
    )
    age.add_metric([], (now - oldest_queued).total_seconds() if oldest_queued else 0)
    yield age

    oldest_request = ApprovalRequest.objects.filter(
        status=ApprovalRequest.Status.PENDING
    ).aggregate(at=Min("requested_at"))["at"]
    pending = GaugeMetricFamily(
        "controlplane_approval_oldest_pending_seconds",
        "Age of the oldest pending approval request (0 when none is pending).",
    )
    pending.add_metric(
        [], (now - oldest_request).total_seconds() if oldest_request else 0
    )
    yield pending
