"""Per-tenant period quotas of tools (a contract's `cost.quota`, e.g. "100/day").

Taken before the call executes, all of a tool's period quotas or none, each by a
conditional UPDATE (`used < limit`) on its window's counter row: PostgreSQL
re-checks the condition on the locked row, SQLite serialises writers, so
concurrent workers never take more than the limit. Windows are UTC: the minute,
hour, day, or the week from Monday. A taken call stays counted whatever its
outcome (it was attempted); per-run quotas are the engine's (runs/engine/
enforcement.py).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from budgets.models import ToolQuotaCounter
from runs.engine.contracts import QuotaLimit


class _Refused(Exception):
    def __init__(self, limit: QuotaLimit) -> None:
        super().__init__(limit.describe())
        self.limit = limit


def quota_window_start(period: str, now: dt.datetime) -> dt.datetime:
    now = now.astimezone(dt.UTC)
    if period == "minute":
        return now.replace(second=0, microsecond=0)
    if period == "hour":
        return now.replace(minute=0, second=0, microsecond=0)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day
    if period == "week":
        return day - dt.timedelta(days=day.weekday())
    raise ValueError(f"no quota period {period!r}")


def _counter_id(tenant_id: Any, limit: QuotaLimit, start: dt.datetime) -> Any:
    key = {
        "tenant_id": tenant_id,
        "bucket": limit.bucket,
        "period": limit.period,
        "window_start": start,
    }
    found = ToolQuotaCounter.objects.filter(**key).values_list("id", flat=True)
    counter_id = found.first()
    if counter_id is not None:
        return counter_id
    try:
        with transaction.atomic():
            return ToolQuotaCounter.objects.create(**key).pk
    except IntegrityError:  # another worker created it first
        return found.get()


def tool_quota_take(
    *, tenant_id: Any, limits: Iterable[QuotaLimit], now: dt.datetime | None = None
) -> QuotaLimit | None:
    """Take one call from each period quota in `limits` (per-run ones are skipped);
    returns the quota that refused (nothing is taken then), or None."""
    periodic = sorted(
        (limit for limit in limits if not limit.per_run),
        key=lambda limit: (limit.bucket, limit.period),  # one lock order
    )
    if not periodic:
        return None
    now = now or timezone.now()
    try:
        with transaction.atomic():
            for limit in periodic:
                start = quota_window_start(limit.period, now)
                counter = _counter_id(tenant_id, limit, start)
                taken = ToolQuotaCounter.objects.filter(
                    id=counter, used__lt=limit.limit
                ).update(used=F("used") + 1)
                if not taken:
                    raise _Refused(limit)
    except _Refused as refused:
        return refused.limit
    return None


def tool_quota_used(
    *, tenant_id: Any, bucket: str, period: str, now: dt.datetime | None = None
) -> int:
    """Calls taken from a bucket in the current window (for tests and views)."""
    start = quota_window_start(period, now or timezone.now())
    used = ToolQuotaCounter.objects.filter(
        tenant_id=tenant_id, bucket=bucket, period=period, window_start=start
    ).values_list("used", flat=True)
    return used.first() or 0
