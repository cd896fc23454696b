"""Reservations that outlived their deadline: an external agent reserved spend
(POST /api/v1/budget/reservations/) and neither settled nor released it before
`expires_at` (it crashed, or lost the answer). Beat gives them back, so a lost
client never holds a tenant's budget for good."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from budgets.ledger import budget_release
from budgets.models import BudgetLedgerEntry
from controlplane.services import audit_record


def budget_reservations_expire(
    *, now: dt.datetime | None = None, batch: int = 500
) -> int:
    """Release up to `batch` open reservations whose `expires_at` has passed,
    oldest deadline first; returns how many this call released. A settle that
    races the release is decided by the ledger row's compare-and-set: whichever
    comes first wins and the other changes nothing."""
    now = now or timezone.now()
    due = (
        BudgetLedgerEntry.objects.filter(
            status=BudgetLedgerEntry.Status.RESERVED,
            expires_at__isnull=False,
            expires_at__lte=now,
        )
        .select_related("tenant")
        .order_by("expires_at")[:batch]
    )
    released = 0
    for entry in due:
        if not budget_release(entry):
            continue  # settled or released meanwhile
        released += 1
        audit_record(
            tenant=entry.tenant,
            actor=None,
            action="budget.reservation_expired",
            object_type="budget_reservation",
            object_id=str(entry.pk),
            before={"status": "reserved", "reserved": entry.reserved},
            after={
                "status": "released",
                "run_id": str(entry.run_id),
                "expires_at": entry.expires_at.isoformat()
                if entry.expires_at
                else None,
            },
        )
    return released
