"""Budget edits, the run ceiling and what a refusal stops a run with.

`budget_update` validates and audits a tenant's budget; running runs see it at
their next reservation (runs.services.admission starts queued runs after it).
The atomic part of spending lives in budgets/ledger.py.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from budgets.models import PERIOD_DIMENSIONS, PERIODS, Budget
from budgets.periods import BudgetRefusal
from budgets.selectors import budget_of, window_usage
from controlplane.models import Tenant
from controlplane.services import audit_record
from runs.engine.budget import BudgetLimits
from runs.engine.stop import StopReason

UNKNOWN_PRICE = "unknown_price"


# Which engine stop reason (and so run status) a refused tenant dimension maps to;
# the exact dimension goes into the run's stop_reason.
_STOP_REASONS = {
    "input_tokens": StopReason.MAX_TOKENS,
    "output_tokens": StopReason.MAX_TOKENS,
    "cost": StopReason.MAX_COST,
    "runs": StopReason.MAX_STEPS,
}


# Per-run caps that a period limit also bounds.
_CAP_FOR_PERIOD = {
    "max_input_tokens": "input_tokens",
    "max_output_tokens": "output_tokens",
    "max_cost": "cost",
}


BUDGET_FIELDS = (
    "period_mode", "allow_unknown_price", "on_exhausted", "extend_by", "limits",
)  # fmt: skip
# What an approval may extend: the period dimensions (runs per period are counted
# when a run starts, before there is anything to resume) and every run cap.
EXTENDABLE_PERIOD_DIMENSIONS = ("input_tokens", "output_tokens", "cost")
EXTENDABLE = (*EXTENDABLE_PERIOD_DIMENSIONS, *BudgetLimits.__dataclass_fields__)
INTEGER_STEPS = {
    "input_tokens", "output_tokens",
    "max_steps", "max_tool_calls", "max_input_tokens", "max_output_tokens",
}  # fmt: skip


class BudgetInputError(ValueError):
    """The budget edit is invalid; names the field; nothing was written."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# ---------------------------------------------------------------- budget edits


def _non_negative(field: str, value: Any, *, integer: bool) -> Any:
    if isinstance(value, bool):
        raise BudgetInputError(field, "must be a non-negative number")
    if integer:
        if not isinstance(value, int) or value < 0:
            raise BudgetInputError(field, "must be a non-negative integer")
        return value
    try:
        number = Decimal(str(value))
    except (InvalidOperation, ValueError) as exc:
        raise BudgetInputError(field, "must be a non-negative number") from exc
    if not isinstance(value, int | float | str | Decimal) or not number.is_finite():
        raise BudgetInputError(field, "must be a non-negative number")
    if number < 0:
        raise BudgetInputError(field, "must be a non-negative number")
    return str(number)


def budget_validate(data: Any, *, current: Budget | None) -> dict[str, Any]:
    """Check a budget edit in the API's shape; returns the model fields to change.

    `{"period_mode", "allow_unknown_price", "limits": {"day", "month", "run",
    "max_concurrent_runs"}}`; every key is optional and an absent one is kept.
    """
    if not isinstance(data, dict):
        raise BudgetInputError("non_field_errors", "expected a JSON object")
    unknown = sorted(set(data) - set(BUDGET_FIELDS))
    if unknown:
        raise BudgetInputError(unknown[0], "unknown field")
    clean: dict[str, Any] = {}
    if "on_exhausted" in data:
        if data["on_exhausted"] not in Budget.OnExhausted.values:
            raise BudgetInputError("on_exhausted", "must be stop or ask")
        clean["on_exhausted"] = data["on_exhausted"]
    if "extend_by" in data:
        clean["extend_by"] = _clean_extend_by(data["extend_by"])
    if "period_mode" in data:
        if data["period_mode"] not in Budget.PeriodMode.values:
            raise BudgetInputError("period_mode", "must be calendar or rolling")
        clean["period_mode"] = data["period_mode"]
    if "allow_unknown_price" in data:
        if not isinstance(data["allow_unknown_price"], bool):
            raise BudgetInputError("allow_unknown_price", "must be true or false")
        clean["allow_unknown_price"] = data["allow_unknown_price"]
    limits = data.get("limits", {})
    if not isinstance(limits, dict):
        raise BudgetInputError("limits", "expected an object")
    unknown = sorted(set(limits) - {*PERIODS, "run", "max_concurrent_runs", "end_user"})
    if unknown:
        raise BudgetInputError(f"limits.{unknown[0]}", "unknown limit")
    periods = {k: v for k, v in limits.items() if k in PERIODS}
    if periods:
        merged = dict(current.period_limits) if current else {}
        merged.update(_clean_period_limits(periods))
        clean["period_limits"] = merged
    if "end_user" in limits:
        clean["end_user_limits"] = _clean_end_user_limits(
            limits["end_user"], current=current
        )
    if "run" in limits:
        clean["run_caps"] = _clean_run_caps(limits["run"])
    if "max_concurrent_runs" in limits:
        value = limits["max_concurrent_runs"]
        if value is not None:
            _non_negative("limits.max_concurrent_runs", value, integer=True)
            if value < 1:
                raise BudgetInputError(
                    "limits.max_concurrent_runs", "must be at least 1 (or null)"
                )
        clean["max_concurrent_runs"] = value
    period_limits = clean.get("period_limits", current.period_limits if current else {})
    run_caps = clean.get("run_caps", current.run_caps if current else {})
    _check_caps_within_periods(run_caps, period_limits)
    return clean


def _clean_extend_by(raw: Any) -> dict[str, Any]:
    """The extension step per dimension; a missing or null one is the limit again."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BudgetInputError("extend_by", "expected an object")
    clean: dict[str, Any] = {}
    for name, value in raw.items():
        field = f"extend_by.{name}"
        if name not in EXTENDABLE:
            raise BudgetInputError(
                field, f"unknown dimension; one of {', '.join(EXTENDABLE)}"
            )
        if value is None:
            continue
        step = _non_negative(field, value, integer=name in INTEGER_STEPS)
        if Decimal(str(step)) <= 0:
            raise BudgetInputError(field, "must be greater than 0 (or null)")
        clean[name] = step
    return clean


def _clean_run_caps(caps: Any) -> dict[str, Any]:
    if not isinstance(caps, dict):
        raise BudgetInputError("limits.run", "expected an object")
    for name, value in caps.items():
        field = f"limits.run.{name}"
        if name not in BudgetLimits.__dataclass_fields__:
            raise BudgetInputError(field, "unknown dimension")
        if value is not None:
            integer = name not in ("max_cost", "max_wall_seconds")
            _non_negative(field, value, integer=integer)
    try:
        parsed = BudgetLimits.from_dict(
            {
                k: Decimal(str(v)) if k == "max_cost" and v is not None else v
                for k, v in caps.items()
            }
        ).to_dict()
    except (ValueError, ArithmeticError) as exc:
        raise BudgetInputError("limits.run", str(exc)) from exc
    return {k: v for k, v in parsed.items() if v is not None}


def _clean_end_user_limits(
    raw: Any, *, current: Budget | None
) -> dict[str, dict[str, Any]]:
    """`limits.end_user`: `{"day": {...}, "month": {...}}` per end user, merged
    per period into what is set (null for a period clears it)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BudgetInputError("limits.end_user", "expected an object")
    merged = dict(current.end_user_limits) if current else {}
    merged.update(_clean_period_limits(raw, prefix="limits.end_user"))
    return {period: limits for period, limits in merged.items() if limits}


def _clean_period_limits(
    raw: Any, *, prefix: str = "limits"
) -> dict[str, dict[str, Any]]:
    if not isinstance(raw, dict):
        raise BudgetInputError(prefix, "expected an object")
    clean: dict[str, dict[str, Any]] = {}
    for period, limits in raw.items():
        if period not in PERIODS:
            raise BudgetInputError(f"{prefix}.{period}", "unknown period")
        if limits is None:
            limits = {}
        if not isinstance(limits, dict):
            raise BudgetInputError(f"{prefix}.{period}", "expected an object")
        clean[period] = {}
        for name, value in limits.items():
            field = f"{prefix}.{period}.{name}"
            if name not in PERIOD_DIMENSIONS:
                raise BudgetInputError(field, "unknown dimension")
            if value is not None:
                clean[period][name] = _non_negative(
                    field, value, integer=name != "cost"
                )
    return clean


def _check_caps_within_periods(
    run_caps: dict[str, Any], period_limits: dict[str, Any]
) -> None:
    for cap, dimension in _CAP_FOR_PERIOD.items():
        if run_caps.get(cap) is None:
            continue
        for period in PERIODS:
            limit = (period_limits.get(period) or {}).get(dimension)
            if limit is not None and Decimal(str(run_caps[cap])) > Decimal(str(limit)):
                raise BudgetInputError(
                    f"limits.run.{cap}",
                    f"is above the tenant's {dimension} limit per {period} ({limit})",
                )


def budget_as_dict(budget: Budget | None) -> dict[str, Any]:
    """The API's shape: every dimension present, None where there is no limit."""
    period_limits = budget.period_limits if budget else {}
    run_caps = budget.run_caps if budget else {}
    limits: dict[str, Any] = {
        period: {
            name: (period_limits.get(period) or {}).get(name)
            for name in PERIOD_DIMENSIONS
        }
        for period in PERIODS
    }
    limits["run"] = {
        name: run_caps.get(name) for name in BudgetLimits.__dataclass_fields__
    }
    limits["max_concurrent_runs"] = budget.max_concurrent_runs if budget else None
    end_user_limits = budget.end_user_limits if budget else {}
    # Per end user a run serves (Run.end_user); with any set, runs must name one.
    limits["end_user"] = {
        period: {
            name: (end_user_limits.get(period) or {}).get(name)
            for name in PERIOD_DIMENSIONS
        }
        for period in PERIODS
    }
    extend_by = budget.extend_by if budget else {}
    return {
        "period_mode": budget.period_mode if budget else "calendar",
        "allow_unknown_price": budget.allow_unknown_price if budget else False,
        "on_exhausted": budget.on_exhausted if budget else "stop",
        "extend_by": {name: extend_by.get(name) for name in EXTENDABLE},
        "limits": limits,
    }


@transaction.atomic
def budget_update(
    *, tenant: Tenant, actor: User | None, data: Any, remote_addr: str | None = None
) -> Budget:
    """Change the tenant's budget (validated, audited); running runs see it at
    their next reservation."""
    Budget.objects.get_or_create(tenant=tenant)
    budget = Budget.objects.select_for_update().get(tenant=tenant)
    clean = budget_validate(data, current=budget)
    before = budget_as_dict(budget)
    for name, value in clean.items():
        setattr(budget, name, value)
    budget.save()
    audit_record(
        tenant=tenant,
        actor=actor,
        action="budget.update",
        object_type="budget",
        object_id=str(budget.pk),
        before=before,
        after=budget_as_dict(budget),
        remote_addr=remote_addr,
    )
    return budget


def budget_usage(*, budget: Budget) -> dict[str, Any]:
    """Used and reserved per period dimension in the budget's current windows."""
    now = timezone.now()
    mode = budget.period_mode
    return {
        period: window_usage(budget.tenant_id, mode, period, now) for period in PERIODS
    }


# ---------------------------------------------------------------- run caps


def tenant_run_ceiling(tenant_id: Any) -> BudgetLimits:
    return run_ceiling_of(budget_of(tenant_id))


def run_ceiling_of(budget: Budget | None) -> BudgetLimits:
    return BudgetLimits.from_dict(budget.run_caps if budget else {})


def stop_reason_for(refusal: BudgetRefusal) -> StopReason:
    for name, reason in _STOP_REASONS.items():
        if refusal.dimension.startswith((f"tenant_{name}_", f"end_user_{name}_")):
            return reason
    return StopReason.MAX_COST  # unknown_price: the cost cannot be bounded
