"""Budget reservations of external agents: spend reserved against the tenant's
budget before an agent that runs in its own process spends it.

An agent (through POST /api/v1/budget/reservations/) reserves amounts for the
external run of its trace id (`run_external_for_trace`, created on first sight),
then settles them with what it actually used, or releases them. The ledger is
the one native runs use (budgets.ledger): the same period limits, the same
atomic refusal naming the dimension and period. A reservation still open at its
`expires_at` is released by beat (budgets.expiry). Settled cost is added to the
run's `cost`, so the run page shows what the agent spent; the run's tokens stay
what its spans report (the instrumentation's usage), which settled tokens would
count a second time.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, QuerySet, Value
from django.db.models.functions import Least
from django.utils import timezone

from budgets.ledger import budget_release, budget_reserve, budget_settle
from budgets.models import BudgetLedgerEntry
from budgets.periods import Amounts, BudgetRefusal
from budgets.selectors import budget_of
from controlplane.models import Tenant
from controlplane.services import audit_record
from runs.models import Run
from runs.services.external import EXTERNAL_STOP_REASON, run_external_for_trace

__all__ = [
    "RESERVABLE",
    "ReservationConflict",
    "ReservationInputError",
    "ReservationRefused",
    "reservation_amounts",
    "reservation_create",
    "reservation_list_for",
    "reservation_release",
    "reservation_settle",
]

# What an external agent may reserve: the period dimensions of its spend. Runs
# per period are counted when a native run starts; an external run is counted
# by nothing (it is recorded, not admitted).
RESERVABLE = ("input_tokens", "output_tokens", "cost")
# The Run.cost column's bound (max_digits=14, decimal_places=6).
_RUN_COST_MAX = Decimal("99999999.999999")
# A reservation beyond this is a typo, not a budget question.
_AMOUNT_MAX: dict[str, Decimal] = {
    "input_tokens": Decimal(10**15),
    "output_tokens": Decimal(10**15),
    "cost": Decimal("1000000000"),
}


class ReservationInputError(ValueError):
    """The request is invalid; `field` names what; nothing was written."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ReservationRefused(Exception):
    """Over the tenant's budget: the refusal names the dimension and period."""

    def __init__(self, refusal: BudgetRefusal) -> None:
        super().__init__(refusal.detail)
        self.refusal = refusal


class ReservationConflict(Exception):
    """The reservation is no longer open (settled, released or expired), or the
    trace is not an external run's; `entry` is the reservation as it is now."""

    def __init__(self, message: str, entry: BudgetLedgerEntry | None = None) -> None:
        super().__init__(message)
        self.entry = entry


def reservation_amounts(data: Any, *, field: str) -> Amounts:
    """Parse `{"input_tokens"?, "output_tokens"?, "cost"?}`: non-negative
    numbers (whole for tokens), known names only."""
    if not isinstance(data, dict):
        raise ReservationInputError(field, "must be an object of amounts")
    unknown = sorted(set(data) - set(RESERVABLE))
    if unknown:
        raise ReservationInputError(
            f"{field}.{unknown[0]}",
            f"unknown amount {unknown[0]!r}; reservable: {', '.join(RESERVABLE)}",
        )
    parsed: dict[str, Any] = {}
    for name in RESERVABLE:
        if name not in data:
            continue
        value = data[name]
        where = f"{field}.{name}"
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ReservationInputError(where, "must be a non-negative number")
        try:
            number = Decimal(str(value))
        except InvalidOperation:
            raise ReservationInputError(
                where, "must be a non-negative number"
            ) from None
        if not number.is_finite() or number < 0:
            raise ReservationInputError(where, "must be a non-negative number")
        if number > _AMOUNT_MAX[name]:
            raise ReservationInputError(where, f"must be at most {_AMOUNT_MAX[name]}")
        if name == "cost":
            if number != number.quantize(Decimal("0.000001")):
                raise ReservationInputError(where, "has more than 6 decimal places")
            parsed[name] = number
        else:
            if number != number.to_integral_value():
                raise ReservationInputError(where, "must be a whole number of tokens")
            parsed[name] = int(number)
    return Amounts(**parsed)


def reservation_list_for(*, tenant: Tenant) -> QuerySet[BudgetLedgerEntry]:
    """The tenant's external agents' reservations (never a native run's own
    ledger entries: those are its steps', settled by the step)."""
    external = Run.objects.filter(
        tenant=tenant, stop_reason=EXTERNAL_STOP_REASON
    ).values("id")
    return BudgetLedgerEntry.objects.filter(
        tenant=tenant, expires_at__isnull=False, run_id__in=external
    ).order_by("-created_at")


def _ttl(ttl_seconds: int | None) -> dt.timedelta:
    longest = int(settings.BUDGET_RESERVATION_MAX_TTL_SECONDS)
    if ttl_seconds is None:
        return dt.timedelta(seconds=settings.BUDGET_RESERVATION_DEFAULT_TTL_SECONDS)
    if ttl_seconds < 1 or ttl_seconds > longest:
        raise ReservationInputError(
            "ttl_seconds", f"must be between 1 and {longest} seconds"
        )
    return dt.timedelta(seconds=ttl_seconds)


def reservation_create(
    *,
    tenant: Tenant,
    user: User,
    trace_id: str,
    amounts: Amounts,
    kind: str = BudgetLedgerEntry.Kind.MODEL_CALL,
    ttl_seconds: int | None = None,
    agent: str = "",
    remote_addr: str | None = None,
) -> BudgetLedgerEntry:
    """Reserve `amounts` for the external run of `trace_id` until `ttl_seconds`
    from now. Over a period limit: ReservationRefused, and nothing is written
    (not even the run a first reservation would have created)."""
    now = timezone.now()
    expires_at = now + _ttl(ttl_seconds)
    with transaction.atomic():
        existing = Run.objects.filter(tenant=tenant, trace_id=trace_id).first()
        if existing is not None and existing.stop_reason != EXTERNAL_STOP_REASON:
            raise ReservationConflict(
                f"trace {trace_id} is a run of this control plane; its steps "
                "reserve their own spend"
            )
        if existing is None and Run.objects.filter(trace_id=trace_id).exists():
            # Another tenant's trace: this tenant's spend is not reserved on a
            # trace it does not own (nothing about that run is said or read).
            raise ReservationConflict(
                f"trace {trace_id} cannot be used by this tenant; start a new trace"
            )
        run = existing or run_external_for_trace(
            tenant=tenant,
            trace_id=trace_id,
            service=agent or "agent",
            started_at=now,
        )
        budget = budget_of(tenant)
        if budget is None:
            # Nothing is limited: the reservation is still recorded (with no
            # counters), so settling it puts its cost on the run.
            entry = BudgetLedgerEntry.objects.create(
                tenant=tenant,
                run_id=run.pk,
                kind=kind,
                reserved=amounts.to_dict(),
                expires_at=expires_at,
            )
        else:
            result = budget_reserve(
                budget=budget,
                run_id=run.pk,
                kind=kind,
                amounts=amounts,
                now=now,
                expires_at=expires_at,
                end_user=run.end_user,
            )
            if isinstance(result, BudgetRefusal):
                # The run a first reservation created goes too: nothing written.
                transaction.set_rollback(True)
                raise ReservationRefused(result)
            entry = result
        audit_record(
            tenant=tenant,
            actor=user,
            action="budget.reserve",
            object_type="budget_reservation",
            object_id=str(entry.pk),
            after={
                "run_id": str(run.pk),
                "trace_id": trace_id,
                "kind": kind,
                "reserved": amounts.to_dict(),
                "expires_at": expires_at.isoformat(),
            },
            remote_addr=remote_addr,
        )
    return reservation_list_for(tenant=tenant).get(pk=entry.pk)


def _open_entry(tenant: Tenant, reservation_id: Any) -> BudgetLedgerEntry:
    """The tenant's reservation, its row locked (the ledger row first, then the
    counters: the one lock order); ReservationConflict when no longer open.
    BudgetLedgerEntry.DoesNotExist for another tenant's or an unknown id."""
    entry = (
        reservation_list_for(tenant=tenant).select_for_update().get(pk=reservation_id)
    )
    if entry.status != BudgetLedgerEntry.Status.RESERVED:
        raise ReservationConflict(
            f"the reservation is already {entry.status}", entry=entry
        )
    return entry


def reservation_settle(
    *,
    tenant: Tenant,
    user: User,
    reservation_id: Any,
    actual: Amounts,
    remote_addr: str | None = None,
) -> BudgetLedgerEntry:
    """Settle the open reservation with what was actually used (more than was
    reserved is recorded too: the spend happened) and add its cost to the run."""
    with transaction.atomic():
        entry = _open_entry(tenant, reservation_id)
        budget_settle(entry, actual)
        Run.objects.filter(id=entry.run_id, stop_reason=EXTERNAL_STOP_REASON).update(
            cost=Least(
                F("cost"), Value(_RUN_COST_MAX - min(actual.cost, _RUN_COST_MAX))
            )
            + Value(min(actual.cost, _RUN_COST_MAX)),
            updated_at=timezone.now(),
            rollup_pending=True,  # the overview's rollups count it again
        )
        audit_record(
            tenant=tenant,
            actor=user,
            action="budget.settle",
            object_type="budget_reservation",
            object_id=str(entry.pk),
            before={"status": "reserved", "reserved": entry.reserved},
            after={"status": "settled", "actual": actual.to_dict()},
            remote_addr=remote_addr,
        )
    return reservation_list_for(tenant=tenant).get(pk=entry.pk)


def reservation_release(
    *,
    tenant: Tenant,
    user: User,
    reservation_id: Any,
    remote_addr: str | None = None,
) -> BudgetLedgerEntry:
    """Give the open reservation back unused."""
    with transaction.atomic():
        entry = _open_entry(tenant, reservation_id)
        budget_release(entry)
        audit_record(
            tenant=tenant,
            actor=user,
            action="budget.release",
            object_type="budget_reservation",
            object_id=str(entry.pk),
            before={"status": "reserved", "reserved": entry.reserved},
            after={"status": "released"},
            remote_addr=remote_addr,
        )
    return reservation_list_for(tenant=tenant).get(pk=entry.pk)
