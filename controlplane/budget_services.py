"""Budget writes and the hooks a run step calls around every spend.

`budget_update` validates and audits a tenant's budget. The run hooks reserve before
a model or tool call and settle after it (controlplane/budget_ledger.py holds the
atomic part), admit a run against the runs-per-period limits, and keep runs beyond
the tenant's concurrency limit queued until a slot frees (oldest first).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from controlplane import metrics
from controlplane.budget_ledger import (
    Amounts,
    BudgetRefusal,
    bucket_start,
    budget_grant_add,
    budget_of,
    budget_release_for_run,
    budget_reserve,
    budget_settle,
    budget_slots_sync,
    window_usage,
)
from controlplane.budget_models import (
    PERIOD_DIMENSIONS,
    PERIODS,
    Budget,
    BudgetGrant,
    BudgetLedgerEntry,
    ModelPriceEntry,
)
from controlplane.models import Role, Tenant
from controlplane.rows import ColumnOf, OrNull, Select, instances_select
from controlplane.services import audit_record
from runs.engine.budget import BudgetLimits, BudgetVector, ModelPrice
from runs.engine.stop import BUDGET_STOP_REASONS, StopReason

if TYPE_CHECKING:
    from runs.engine.actions import ModelReply
    from runs.engine.adapters import ModelError
    from runs.engine.step import ModelCallPlan
    from runs.engine.tools import Tool
    from runs.models import Run

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
_INTEGER_STEPS = {
    "input_tokens", "output_tokens",
    "max_steps", "max_tool_calls", "max_input_tokens", "max_output_tokens",
}  # fmt: skip


class BudgetInputError(ValueError):
    """The budget edit is invalid; names the field; nothing was written."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# ---------------------------------------------------------------- prices


@dataclass(frozen=True)
class PriceLookup:
    price: ModelPrice
    known: bool
    cached_input_per_million: Decimal = Decimal(0)


def model_price_for(*, model: str, tenant_id: Any) -> PriceLookup:
    """The tenant's row, else the global row, else the settings default, else unknown.

    An unknown price counts tokens at zero cost; whether the run may go on is
    decided at reservation time (the cost cannot be bounded).
    """
    return model_price_of(
        model_price_select(model=model, tenant_id=tenant_id).run(), model=model
    )


def model_price_select(*, model: str | ColumnOf, tenant_id: Any) -> Select:
    """`model_price_for`'s query, to run with others; `model` may be read by it
    (the model an agent names: `ColumnOf(Agent, "model", agent_id)`)."""
    return instances_select(
        ModelPriceEntry, {"tenant": OrNull(tenant_id), "model": model}
    )


def model_price_of(rows: list[ModelPriceEntry], *, model: str) -> PriceLookup:
    """`model_price_for` from what `model_price_select` found."""
    row = next((r for r in rows if r.tenant_id is not None), None) or next(
        iter(rows), None
    )
    if row is not None:
        return PriceLookup(
            ModelPrice(row.input_per_million, row.output_per_million),
            True,
            row.cached_input_per_million,
        )
    default = settings.BUDGET_DEFAULT_PRICES.get(model)
    if default is not None:
        return PriceLookup(
            ModelPrice(Decimal(default[0]), Decimal(default[2])),
            True,
            Decimal(default[1]),
        )
    return PriceLookup(ModelPrice(), False)


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
    unknown = sorted(set(limits) - {*PERIODS, "run", "max_concurrent_runs"})
    if unknown:
        raise BudgetInputError(f"limits.{unknown[0]}", "unknown limit")
    periods = {k: v for k, v in limits.items() if k in PERIODS}
    if periods:
        merged = dict(current.period_limits) if current else {}
        merged.update(_clean_period_limits(periods))
        clean["period_limits"] = merged
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
        step = _non_negative(field, value, integer=name in _INTEGER_STEPS)
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


def _clean_period_limits(raw: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(raw, dict):
        raise BudgetInputError("period_limits", "expected an object")
    clean: dict[str, dict[str, Any]] = {}
    for period, limits in raw.items():
        if period not in PERIODS:
            raise BudgetInputError(f"limits.{period}", "unknown period")
        if limits is None:
            limits = {}
        if not isinstance(limits, dict):
            raise BudgetInputError(f"limits.{period}", "expected an object")
        clean[period] = {}
        for name, value in limits.items():
            field = f"limits.{period}.{name}"
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
    their next reservation, queued runs start if the concurrency limit grew."""
    Budget.objects.get_or_create(tenant=tenant)
    budget = Budget.objects.select_for_update().get(tenant=tenant)
    clean = budget_validate(data, current=budget)
    before = budget_as_dict(budget)
    for name, value in clean.items():
        setattr(budget, name, value)
    budget.version += 1
    budget.save()
    budget_slots_sync(budget=budget)  # re-divide the current buckets' limits
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
    runs_start_queued(tenant_id=tenant.pk)
    return budget


def budget_usage(*, tenant: Tenant) -> dict[str, Any]:
    """Used and reserved per period dimension in the current windows.

    A tenant without a budget has no ledger (nothing is reserved where nothing
    is limited): its use is what the window's runs recorded themselves."""
    budget = budget_of(tenant)
    now = timezone.now()
    if budget is None:
        return {
            period: _runs_window_usage(tenant.pk, period, now) for period in PERIODS
        }
    mode = budget.period_mode
    return {period: window_usage(tenant.pk, mode, period, now) for period in PERIODS}


def _runs_window_usage(
    tenant_id: Any, period: str, now: dt.datetime
) -> dict[str, dict[str, str]]:
    """The calendar window's own runs' counters (ingested traces spend nothing
    here, so they are left out), in `window_usage`'s shape."""
    start = bucket_start(Budget.PeriodMode.CALENDAR, period, now)
    totals = (
        _runs()
        .objects.filter(tenant_id=tenant_id, created_at__gte=start)
        .exclude(stop_reason="external")
        .aggregate(
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
            cost=Sum("cost"),
            runs=Count("id"),
        )
    )
    return {
        name: {"used": str(totals[name] or 0), "reserved": "0"}
        for name in PERIOD_DIMENSIONS
    }


# ---------------------------------------------------------------- run caps


def tenant_run_ceiling(tenant_id: Any) -> BudgetLimits:
    return run_ceiling_of(budget_of(tenant_id))


def run_ceiling_of(budget: Budget | None) -> BudgetLimits:
    return BudgetLimits.from_dict(budget.run_caps if budget else {})


# ---------------------------------------------------------------- run hooks


def _event(run: Run, type: str, payload: dict[str, Any]) -> None:
    from tracing.services import run_event_append

    run_event_append(run=run, type=type, payload=payload)


def stop_reason_for(refusal: BudgetRefusal) -> StopReason:
    for name, reason in _STOP_REASONS.items():
        if refusal.dimension.startswith(f"tenant_{name}_"):
            return reason
    return StopReason.MAX_COST  # unknown_price: the cost cannot be bounded


def _refuse(run: Run, refusal: BudgetRefusal, **payload: Any) -> BudgetRefusal:
    metrics.budget_refused(dimension=refusal.dimension)
    _event(
        run,
        "budget.exhausted",
        {"dimension": refusal.dimension, "detail": refusal.detail, **payload},
    )
    return refusal


def budget_before_model_call(
    *,
    run: Run,
    plan: ModelCallPlan,
    price_known: bool,
    step_index: int,
    budget: Budget | None,
) -> BudgetLedgerEntry | BudgetRefusal | None:
    """Reserve the model call's worst case; None when the tenant has no budget.
    `budget`: the tenant's, read at the step's start."""
    if not price_known and not (budget and budget.allow_unknown_price):
        period_cost = budget is not None and any(
            (budget.period_limits.get(period) or {}).get("cost") is not None
            for period in PERIODS
        )
        if period_cost or run.limits.get("max_cost") is not None:
            return _refuse(
                run,
                BudgetRefusal(
                    UNKNOWN_PRICE,
                    f"the price of model {run.agent.model!r} is unknown, so the "
                    "cost of this run cannot be bounded",
                ),
            )
    if budget is None:
        return None
    amounts = Amounts(
        input_tokens=plan.reservation.input_tokens,
        output_tokens=plan.reservation.output_tokens,
        cost=plan.reservation.cost,
    )
    result = budget_reserve(
        budget=budget,
        run_id=run.pk,
        kind=BudgetLedgerEntry.Kind.MODEL_CALL,
        amounts=amounts,
        step_index=step_index,
    )
    if isinstance(result, BudgetRefusal):
        return _refuse(run, result, kind="model_call", wanted=amounts.to_dict())
    _event(
        run,
        "budget.reserved",
        {"kind": "model_call", "entry": str(result.pk), **amounts.to_dict()},
    )
    return result


def budget_after_model_call(
    *,
    run: Run,
    entry: BudgetLedgerEntry | BudgetRefusal | None,
    reply: ModelReply | ModelError,
    plan: ModelCallPlan,
    price: ModelPrice,
    usage: BudgetVector,
    limits: BudgetLimits,
) -> None:
    """Settle with the recorded usage (never the model's own claims of cost)."""
    from runs.engine.actions import ModelReply
    from runs.engine.step import billable_usage

    spent = BudgetVector()
    if isinstance(reply, ModelReply):
        billed = billable_usage(reply, plan)
        spent = BudgetVector(
            steps=1,
            input_tokens=billed.input_tokens,
            output_tokens=billed.output_tokens,
            cost=price.cost(billed.input_tokens, billed.output_tokens),
        )
        metrics.spend_recorded(
            kind="model_call", cost=spent.cost, input_tokens=spent.input_tokens,
            output_tokens=spent.output_tokens,
        )  # fmt: skip
    if isinstance(entry, BudgetLedgerEntry):
        actual = Amounts(spent.input_tokens, spent.output_tokens, spent.cost)
        budget_settle(entry, actual)
        _event(
            run,
            "budget.settled",
            {"kind": "model_call", "entry": str(entry.pk), **actual.to_dict()},
        )
    span_remaining(usage + spent, limits)


def budget_before_tool_call(
    *, run: Run, tool: Tool, call_id: str
) -> BudgetLedgerEntry | BudgetRefusal | None:
    """Reserve the tool's declared cost; None when there is nothing to reserve."""
    cost = tool.money_cost
    if cost <= 0:
        return None
    budget = budget_of(run.tenant_id)
    if budget is None:
        return None
    amounts = Amounts(cost=cost)
    result = budget_reserve(
        budget=budget,
        run_id=run.pk,
        kind=BudgetLedgerEntry.Kind.TOOL_CALL,
        amounts=amounts,
        call_id=call_id,
    )
    if isinstance(result, BudgetRefusal):
        return _refuse(run, result, kind="tool_call", tool=tool.contract.name)
    _event(
        run,
        "budget.reserved",
        {"kind": "tool_call", "entry": str(result.pk), **amounts.to_dict()},
    )
    return result


def budget_after_tool_call(
    *,
    run: Run,
    entry: BudgetLedgerEntry | BudgetRefusal | None,
    tool: Tool,
    executed: bool,
    usage: BudgetVector,
    limits: BudgetLimits,
) -> None:
    if executed:
        metrics.spend_recorded(kind="tool_call", cost=tool.money_cost)
    if isinstance(entry, BudgetLedgerEntry):
        actual = Amounts(cost=tool.money_cost if executed else Decimal(0))
        budget_settle(entry, actual)
        _event(
            run,
            "budget.settled",
            {"kind": "tool_call", "entry": str(entry.pk), **actual.to_dict()},
        )
    span_remaining(usage, limits)


def span_remaining(usage: BudgetVector, limits: BudgetLimits) -> None:
    """Put what is left of each run cap on the current span."""
    from opentelemetry import trace

    span = trace.get_current_span()
    for name, left in run_remaining(usage, limits).items():
        span.set_attribute(f"budget.remaining.{name}", float(left))


def run_remaining(usage: BudgetVector, limits: BudgetLimits) -> dict[str, Any]:
    pairs: dict[str, tuple[Any, Any]] = {
        "steps": (usage.steps, limits.max_steps),
        "tool_calls": (usage.tool_calls, limits.max_tool_calls),
        "input_tokens": (usage.input_tokens, limits.max_input_tokens),
        "output_tokens": (usage.output_tokens, limits.max_output_tokens),
        "cost": (usage.cost, limits.max_cost),
        "wall_seconds": (usage.wall_seconds, limits.max_wall_seconds),
    }
    return {name: cap - used for name, (used, cap) in pairs.items() if cap is not None}


def run_usage_against_caps(run: Run) -> dict[str, dict[str, Any]]:
    """For the run API: each dimension's use next to its cap (None: uncapped),
    approved extensions included."""
    limits = limits_with_extensions(
        BudgetLimits.from_dict(run.limits), run.limit_extensions
    )
    wall = float((run.engine_state.get("usage") or {}).get("wall_seconds", 0.0))
    max_cost = None if limits.max_cost is None else str(limits.max_cost)
    pairs = {
        "steps": (run.steps, limits.max_steps),
        "tool_calls": (run.tool_calls, limits.max_tool_calls),
        "input_tokens": (run.input_tokens, limits.max_input_tokens),
        "output_tokens": (run.output_tokens, limits.max_output_tokens),
        "cost": (str(run.cost), max_cost),
        "wall_seconds": (round(wall, 3), limits.max_wall_seconds),
    }
    return {name: {"used": used, "cap": cap} for name, (used, cap) in pairs.items()}


def budget_run_ended(
    *, run: Run, reason: StopReason, dimension: str = "", detail: str = ""
) -> None:
    """The run ended: release what it still holds, say so if a run cap stopped it
    (the ledger already said so for a tenant limit), and free its slot."""
    budget_release_for_run(run_id=run.pk)
    if not dimension and reason in BUDGET_STOP_REASONS:
        payload = {"dimension": str(reason), "detail": detail, "kind": "run_cap"}
        _event(run, "budget.exhausted", payload)
    runs_start_queued(tenant_id=run.tenant_id)


def budget_release_run(*, run_id: Any) -> int:
    """Release a run's open reservations (it ended, or its step crashed)."""
    return budget_release_for_run(run_id=run_id)


# ---------------------------------------------------------------- admission


def budget_admit_run(*, run: Run) -> BudgetRefusal | None:
    """Count the run against the runs-per-period limits; a refusal changes nothing."""
    budget = budget_of(run.tenant_id)
    if budget is None:
        return None
    one = Amounts(runs=1)
    result = budget_reserve(
        budget=budget, run_id=run.pk, kind=BudgetLedgerEntry.Kind.RUN, amounts=one
    )
    if isinstance(result, BudgetRefusal):
        return _refuse(run, result, kind="run")
    budget_settle(result, one)
    return None


def _runs() -> type[Run]:
    # runs is above controlplane; its model is read here, never imported at load.
    from runs.models import Run

    return Run


def _active_runs(tenant_id: Any) -> Any:
    Run = _runs()  # noqa: N806 - the model class
    return Run.objects.filter(tenant_id=tenant_id).filter(
        Q(status__in=[Run.Status.RUNNING, Run.Status.WAITING_APPROVAL])
        | Q(status=Run.Status.QUEUED, step_token__isnull=False)
    )


def active_run_count(*, tenant_id: Any) -> int:
    """Runs holding a concurrency slot: queued with a task, running or waiting."""
    count: int = _active_runs(tenant_id).count()
    return count


def run_slot_claim(*, run: Run) -> bool:
    """Whether the new run may start now (call inside run_start's transaction).

    The budget row lock orders concurrent starts; a run that gets no slot stays
    queued with no step token and no task (nothing is held while it waits).
    """
    budget = Budget.objects.select_for_update().filter(tenant_id=run.tenant_id).first()
    if budget is None or budget.max_concurrent_runs is None:
        return True
    active: int = _active_runs(run.tenant_id).exclude(id=run.pk).count()
    return active < budget.max_concurrent_runs


def runs_start_queued(*, tenant_id: Any) -> int:
    """Start the tenant's oldest waiting runs while slots are free."""
    from runs.models import Run
    from runs.services.lifecycle import step_enqueue

    with transaction.atomic():
        budget = Budget.objects.select_for_update().filter(tenant_id=tenant_id).first()
        waiting = Run.objects.select_for_update(skip_locked=True).filter(
            tenant_id=tenant_id, status=Run.Status.QUEUED, step_token__isnull=True
        )
        if budget is not None and budget.max_concurrent_runs is not None:
            free = budget.max_concurrent_runs - _active_runs(tenant_id).count()
            if free <= 0:
                return 0
            waiting = waiting.order_by("created_at", "id")[:free]
        else:
            waiting = waiting.order_by("created_at", "id")
        started = 0
        for run in waiting:
            step_enqueue(run)
            started += 1
        return started


# ---------------------------------------------------------------- extensions


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


def _budget_that_asks(run: Run) -> Budget | None:
    """The tenant's budget if it asked to be asked, and somebody may answer."""
    from controlplane.models import Membership
    from controlplane.permissions import Action, role_may

    budget = budget_of(run.tenant_id)
    if budget is None or budget.on_exhausted != Budget.OnExhausted.ASK:
        return None
    roles = [role for role in Role.values if role_may(role, Action.APPROVAL_DECIDE)]
    deciders = Membership.objects.filter(
        tenant_id=run.tenant_id, role__in=roles, user__is_active=True
    )
    return budget if deciders.exists() else None  # unattended: stop


def _extension_step(budget: Budget, name: str, current: Decimal) -> Decimal:
    configured = (budget.extend_by or {}).get(name)
    return Decimal(str(configured)) if configured is not None else current


def budget_period_extension_ask(
    *, run: Run, refusal: BudgetRefusal
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
    run: Run,
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
    if cap in _INTEGER_STEPS:
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


def budget_grant_create(*, run: Run, ask: dict[str, Any]) -> BudgetGrant:
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
        if cap in _INTEGER_STEPS:
            raised[cap] = int(total)
        elif cap == "max_wall_seconds":
            raised[cap] = float(total)
        else:
            raised[cap] = str(total)
    return BudgetLimits.from_dict(raised)


def budget_run_cap_refused_event(*, run: Run, ask: ExtensionAsk) -> None:
    """The escalation signal for a run cap in ask mode (stop mode writes it when
    the run ends): `budget.exhausted` with `action: ask`."""
    _event(
        run,
        "budget.exhausted",
        {"dimension": ask.dimension, "detail": ask.detail, "kind": "run_cap",
         "action": "ask"},
    )  # fmt: skip
