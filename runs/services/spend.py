"""The budget hooks a run step calls around every spend, in the run's terms.

Before a model or tool call the ledger reserves its worst case (budgets.ledger);
after it, the recorded use settles the reservation. Each hook writes the run's
`budget.*` events; a refusal names the exact dimension.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from opentelemetry import trace

from budgets.extensions import ExtensionAsk, limits_with_extensions
from budgets.ledger import budget_reserve, budget_settle
from budgets.models import Budget, BudgetLedgerEntry
from budgets.periods import Amounts, BudgetRefusal
from budgets.prices import model_price_for, unknown_price_refused
from budgets.selectors import budget_of
from budgets.services import UNKNOWN_PRICE
from controlplane import metrics
from runs.engine.actions import ModelReply, Usage
from runs.engine.adapters import ModelError
from runs.engine.budget import BudgetLimits, BudgetVector, ModelPrice
from runs.engine.step import ModelCallPlan, billable_usage
from runs.engine.tools import Tool
from runs.models import Run
from tracing.services import run_event_append


def run_budget_event(run: Run, type: str, payload: dict[str, Any]) -> None:
    """Append a `budget.*` event to the run's log."""
    run_event_append(run=run, type=type, payload=payload)


def run_budget_refused(
    run: Run, refusal: BudgetRefusal, **payload: Any
) -> BudgetRefusal:
    metrics.budget_refused(dimension=refusal.dimension)
    run_budget_event(
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
    if not price_known and unknown_price_refused(budget=budget, run_limits=run.limits):
        return _unknown_price_refused(run, _model_of(run))
    if budget is None:
        return None
    amounts = Amounts(
        input_tokens=plan.reservation.input_tokens,
        output_tokens=plan.reservation.output_tokens,
        cost=plan.reservation.cost,
    )
    return _model_call_reserve(
        run=run, budget=budget, amounts=amounts, step_index=step_index,
        label="model_call",
    )  # fmt: skip


def _model_call_reserve(
    *, run: Run, budget: Budget, amounts: Amounts, step_index: int, label: str
) -> BudgetLedgerEntry | BudgetRefusal:
    """Reserve a model call (the agent's, or a guardrail's: `label`) and log it."""
    result = budget_reserve(
        budget=budget,
        run_id=run.pk,
        kind=BudgetLedgerEntry.Kind.MODEL_CALL,
        amounts=amounts,
        step_index=step_index,
        end_user=run.end_user,
    )
    if isinstance(result, BudgetRefusal):
        return run_budget_refused(run, result, kind=label, wanted=amounts.to_dict())
    run_budget_event(
        run,
        "budget.reserved",
        {"kind": label, "entry": str(result.pk), **amounts.to_dict()},
    )
    return result


def _unknown_price_refused(run: Run, model: str) -> BudgetRefusal:
    return run_budget_refused(
        run,
        BudgetRefusal(
            UNKNOWN_PRICE,
            f"the price of model {model!r} is unknown, so the cost of this run "
            "cannot be bounded",
        ),
    )


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
        _model_call_settle(run, entry, spent, label="model_call")
    span_remaining(usage + spent, limits)


def _model_call_settle(
    run: Run, entry: BudgetLedgerEntry, spent: BudgetVector, *, label: str
) -> None:
    actual = Amounts(spent.input_tokens, spent.output_tokens, spent.cost)
    budget_settle(entry, actual)
    run_budget_event(
        run,
        "budget.settled",
        {"kind": label, "entry": str(entry.pk), **actual.to_dict()},
    )


def budget_before_guardrail_call(
    *, run: Run, model: str, worst: Usage
) -> tuple[BudgetLedgerEntry | None, ModelPrice] | BudgetRefusal:
    """Reserve a guardrail's model call like the agent's own (its model's
    price, `worst` its most tokens); the entry (None without a tenant budget)
    and the price to settle with."""
    price = model_price_for(model=model, tenant_id=run.tenant_id)
    budget = budget_of(run.tenant_id)
    if not price.known and unknown_price_refused(budget=budget, run_limits=run.limits):
        return _unknown_price_refused(run, model)
    if budget is None:
        return None, price.price
    amounts = Amounts(
        input_tokens=worst.input_tokens,
        output_tokens=worst.output_tokens,
        cost=price.price.cost(worst.input_tokens, worst.output_tokens),
    )
    result = _model_call_reserve(
        run=run, budget=budget, amounts=amounts, step_index=run.steps,
        label="guardrail",
    )  # fmt: skip
    if isinstance(result, BudgetRefusal):
        return result
    return result, price.price


def budget_after_guardrail_call(
    *,
    run: Run,
    entry: BudgetLedgerEntry | None,
    price: ModelPrice,
    usage: Usage | None,
) -> BudgetVector:
    """Settle with what the call used (nothing when it failed); returns it for
    the run's own counters (no step: the run's steps are the agent's turns)."""
    used = usage or Usage()
    spent = BudgetVector(
        input_tokens=used.input_tokens,
        output_tokens=used.output_tokens,
        cost=price.cost(used.input_tokens, used.output_tokens),
    )
    if usage is not None:
        metrics.spend_recorded(
            kind="model_call", cost=spent.cost, input_tokens=spent.input_tokens,
            output_tokens=spent.output_tokens,
        )  # fmt: skip
    if entry is not None:
        _model_call_settle(run, entry, spent, label="guardrail")
    return spent


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
        end_user=run.end_user,
    )
    if isinstance(result, BudgetRefusal):
        return run_budget_refused(
            run, result, kind="tool_call", tool=tool.contract.name
        )
    run_budget_event(
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
        run_budget_event(
            run,
            "budget.settled",
            {"kind": "tool_call", "entry": str(entry.pk), **actual.to_dict()},
        )
    span_remaining(usage, limits)


def span_remaining(usage: BudgetVector, limits: BudgetLimits) -> None:
    """Put what is left of each run cap on the current span."""
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


def budget_run_cap_refused_event(*, run: Run, ask: ExtensionAsk) -> None:
    """The escalation signal for a run cap in ask mode (stop mode writes it when
    the run ends): `budget.exhausted` with `action: ask`."""
    run_budget_event(
        run,
        "budget.exhausted",
        {"dimension": ask.dimension, "detail": ask.detail, "kind": "run_cap",
         "action": "ask"},
    )  # fmt: skip


def _model_of(run: Run) -> str:
    return run.agent_version.model if run.agent_version else ""
