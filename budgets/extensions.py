"""Budget extensions in ledger terms: what to ask for, and the grant once approved.

When a reservation or a run cap refuses a run whose tenant chose `ask`, the run
asks "extend <dimension> by X" instead of ending; approved, a period limit grows
by a grant of this run (the ledger reserves from it) and a run cap by the run's
own extension (`limits_with_extensions`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any, Protocol

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from budgets.models import Budget, BudgetGrant
from budgets.periods import BudgetRefusal, bucket_start
from budgets.selectors import budget_of
from budgets.services import EXTENDABLE_PERIOD_DIMENSIONS, INTEGER_STEPS
from controlplane.models import Membership, Role
from controlplane.permissions import Action, role_may
from runs.engine.budget import BudgetLimits, BudgetVector
from runs.engine.stop import BUDGET_STOP_REASONS, StopReason


class RunRef(Protocol):
    """A run as the ledger knows it: by id, in a tenant (budgets never imports runs)."""

    @property
    def pk(self) -> Any: ...

    @property
    def tenant_id(self) -> Any: ...


@dataclass(frozen=True)
class ExtensionAsk:
    """An approval "extend <dimension> by X" to ask instead of ending the run.

    `scope` is `period` (a per-run grant on a period limit of the bucket the
    reservation was refused in) or `run_cap` (the run's own cap). `stop_reason`
    is what the run ends with on a deny or an expiry.
    """

    scope: str
    dimension: str  # the refused dimension, e.g. tenant_cost_per_day or max_cost
    name: str  # what grows: a period dimension (cost) or a run cap (max_cost)
    amount: Decimal  # X
    limit: Decimal  # what the run is held to now
    used: Decimal  # used (and reserved) against it
    wanted: Decimal  # what the refused reservation or call needed
    stop_reason: str
    detail: str
    period: str = ""
    bucket_start: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "dimension": self.dimension,
            "name": self.name,
            "amount": _number(self.amount),
            "limit": _number(self.limit),
            "used": _number(self.used),
            "wanted": _number(self.wanted),
            "stop_reason": self.stop_reason,
            "detail": self.detail,
            "period": self.period,
            "bucket_start": self.bucket_start,
        }


def _number(value: Decimal) -> str:
    """A decimal as plain text without trailing zeros ("5", "0.25")."""
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _budget_that_asks(run: RunRef) -> Budget | None:
    """The tenant's budget if it asked to be asked, and somebody may answer."""
    budget = budget_of(run.tenant_id)
    if budget is None or budget.on_exhausted != Budget.OnExhausted.ASK:
        return None
    roles = [role for role in Role.values if role_may(role, Action.APPROVAL_DECIDE)]
    deciders = Membership.objects.filter(
        tenant_id=run.tenant_id,
        role__in=roles,
        user__is_active=True,
        deactivated_at__isnull=True,
    )
    return budget if deciders.exists() else None  # unattended: stop


def _extension_step(budget: Budget, name: str, current: Decimal) -> Decimal:
    configured = (budget.extend_by or {}).get(name)
    return Decimal(str(configured)) if configured is not None else current


def budget_period_extension_ask(
    *, run: RunRef, refusal: BudgetRefusal
) -> ExtensionAsk | None:
    """For a refused period reservation in ask mode: extend it by the tenant's
    step (or the limit again), at least by what the reservation lacks."""
    if refusal.name not in EXTENDABLE_PERIOD_DIMENSIONS or not refusal.period:
        return None
    budget = _budget_that_asks(run)
    if budget is None:
        return None
    base = _limits_of_period(budget, refusal.period).get(refusal.name, Decimal(0))
    step = _extension_step(budget, refusal.name, base)
    amount = max(step, refusal.needed)
    if refusal.name != "cost":
        amount = amount.to_integral_value(rounding=ROUND_CEILING)
    start = bucket_start(budget.period_mode, refusal.period, timezone.now())
    return ExtensionAsk(
        scope="period",
        dimension=refusal.dimension,
        name=refusal.name,
        amount=amount,
        limit=refusal.limit,
        used=refusal.total,
        wanted=refusal.wanted,
        stop_reason=refusal.dimension,
        detail=refusal.detail,
        period=refusal.period,
        bucket_start=start.isoformat(),
    )


def _limits_of_period(budget: Budget, period: str) -> dict[str, Decimal]:
    raw = (budget.period_limits or {}).get(period) or {}
    return {k: Decimal(str(v)) for k, v in raw.items() if v is not None}


def budget_cap_extension_ask(
    *,
    run: RunRef,
    reason: StopReason,
    usage: BudgetVector,
    limits: BudgetLimits,
    reserve_output_tokens: int = 0,
    estimated_input_tokens: int = 0,
    call_cost: Decimal = Decimal(0),
) -> ExtensionAsk | None:
    """For a call refused by one of the run's caps in ask mode: which cap, and by
    how much to raise it (the tenant's step or the cap again, at least enough)."""
    if reason not in BUDGET_STOP_REASONS:
        return None
    cap, used, wanted = _refused_cap(
        reason, usage, limits, reserve_output_tokens, estimated_input_tokens, call_cost
    )
    current = getattr(limits, cap)
    if current is None:
        return None
    budget = _budget_that_asks(run)
    if budget is None:
        return None
    current = Decimal(str(current))
    shortfall = used + wanted - current
    if cap == "max_wall_seconds":  # the deadline is reached at the cap itself
        shortfall = used - current + 1
    amount = max(_extension_step(budget, cap, current), shortfall, Decimal(0))
    if cap in INTEGER_STEPS:
        amount = amount.to_integral_value(rounding=ROUND_CEILING)
    detail = f"the run's {cap} is {_number(current)}; {_number(used)} is used"
    if wanted:
        detail += f" and this needs {_number(wanted)}"
    return ExtensionAsk(
        scope="run_cap",
        dimension=str(reason),
        name=cap,
        amount=amount,
        limit=current,
        used=used,
        wanted=wanted,
        stop_reason=str(reason),
        detail=detail,
    )


def _refused_cap(
    reason: StopReason,
    usage: BudgetVector,
    limits: BudgetLimits,
    reserve_output_tokens: int,
    estimated_input_tokens: int,
    call_cost: Decimal,
) -> tuple[str, Decimal, Decimal]:
    """The exact cap behind an engine stop reason (max_tokens names two)."""
    if reason is StopReason.DEADLINE:
        wall = Decimal(str(round(usage.wall_seconds, 3)))
        return "max_wall_seconds", wall, Decimal(0)
    if reason is StopReason.MAX_STEPS:
        return "max_steps", Decimal(usage.steps), Decimal(1)
    if reason is StopReason.MAX_TOOL_CALLS:
        return "max_tool_calls", Decimal(usage.tool_calls), Decimal(1)
    if reason is StopReason.MAX_TOKENS:
        output_cap = limits.max_output_tokens
        if output_cap is not None and (
            usage.output_tokens + reserve_output_tokens > output_cap
        ):
            return (
                "max_output_tokens",
                Decimal(usage.output_tokens),
                Decimal(reserve_output_tokens),
            )
        return (
            "max_input_tokens",
            Decimal(usage.input_tokens),
            Decimal(estimated_input_tokens),
        )
    return "max_cost", usage.cost, call_cost


def budget_grant_add(
    *,
    tenant_id: Any,
    run_id: Any,
    period: str,
    bucket_start: dt.datetime,
    dimension: str,
    amount: Decimal,
) -> BudgetGrant:
    """Extend the run's grant on one period dimension of one bucket by `amount`."""
    with transaction.atomic():
        grant, created = BudgetGrant.objects.select_for_update().get_or_create(
            run_id=run_id,
            period=period,
            bucket_start=bucket_start,
            dimension=dimension,
            defaults={"tenant_id": tenant_id, "amount": amount},
        )
        if not created:
            BudgetGrant.objects.filter(id=grant.id).update(amount=F("amount") + amount)
            grant.refresh_from_db()
    return grant


def budget_grant_create(*, run: RunRef, ask: dict[str, Any]) -> BudgetGrant:
    """Grant an approved extension of a period limit to this run, in the bucket
    its reservation was refused in (added to an earlier grant there)."""
    return budget_grant_add(
        tenant_id=run.tenant_id,
        run_id=run.pk,
        period=ask["period"],
        bucket_start=dt.datetime.fromisoformat(ask["bucket_start"]),
        dimension=ask["name"],
        amount=Decimal(str(ask["amount"])),
    )


def limits_with_extensions(
    limits: BudgetLimits, extensions: dict[str, Any] | None
) -> BudgetLimits:
    """The run's caps raised by its approved extensions (an uncapped one stays so)."""
    if not extensions:
        return limits
    raised = limits.to_dict()
    for cap, extra in extensions.items():
        current = raised.get(cap)
        if current is None:
            continue
        total = Decimal(str(current)) + Decimal(str(extra))
        if cap in INTEGER_STEPS:
            raised[cap] = int(total)
        elif cap == "max_wall_seconds":
            raised[cap] = float(total)
        else:
            raised[cap] = str(total)
    return BudgetLimits.from_dict(raised)
