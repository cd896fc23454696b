"""Build the engine parts of a run: model adapter, tools, policy, limits, evaluator."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from budgets.extensions import limits_with_extensions
from budgets.models import Budget
from budgets.prices import PriceLookup, model_price_for
from budgets.services import run_ceiling_of
from runs.engine.adapters import ModelAdapter, build_model_adapter
from runs.engine.budget import BudgetLimits
from runs.engine.enforcement import RetryPolicy
from runs.engine.evaluator import Evaluator
from runs.engine.loop import AgentConfig
from runs.engine.policy import PolicyHook
from runs.engine.tools import ToolRegistry
from runs.evaluators import evaluator_for
from runs.models import Agent, Run
from runs.tools.registry import tool_registry_for


@dataclass(frozen=True)
class RunRuntime:
    config: AgentConfig
    registry: ToolRegistry
    model: ModelAdapter
    policy: PolicyHook
    limits: BudgetLimits
    evaluator: Evaluator | None
    price_known: bool = True
    budget: Budget | None = None  # the tenant's, read at the step's start


def effective_limits(
    agent: Agent, requested: dict[str, Any], ceiling: BudgetLimits | None = None
) -> BudgetLimits:
    """The run's caps: the lowest of the platform default, the tenant's ceiling, the
    agent's and the run's.

    An agent or a run request may lower a cap but never raise it; a request above
    the tenant's ceiling is an error (ValueError naming the cap).
    """
    wanted = BudgetLimits.from_dict(requested)
    if ceiling is not None:
        for name, value in wanted.to_dict().items():
            top = getattr(ceiling, name)
            if value is not None and top is not None and float(value) > float(top):
                raise ValueError(
                    f"{name} {value} is above the tenant's ceiling of {top}"
                )
    return min_limits(
        BudgetLimits.from_dict(settings.RUN_DEFAULT_LIMITS),
        ceiling or BudgetLimits(),
        BudgetLimits.from_dict(agent.default_limits),
        wanted,
    )


def min_limits(*layers: BudgetLimits) -> BudgetLimits:
    """The lowest cap per dimension over the layers (None: uncapped)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for name, value in layer.to_dict().items():
            if value is None:
                continue
            current = merged.get(name)
            merged[name] = value if current is None else min(current, value, key=float)
    return BudgetLimits.from_dict(merged)


def model_adapter_for(agent: Agent, *, replies_consumed: int) -> ModelAdapter:
    api_key = os.environ.get(agent.api_key_env, "") if agent.api_key_env else ""
    return build_model_adapter(
        agent.model_adapter,
        model=agent.model,
        script=agent.script,
        script_position=replies_consumed,
        api_key=api_key,
        base_url=agent.base_url or None,
        deadline_seconds=settings.RUN_MODEL_DEADLINE_SECONDS,
    )


def runtime_for(
    run: Run,
    *,
    replies_consumed: int,
    budget: Budget | None,
    price: PriceLookup | None = None,
) -> RunRuntime:
    """`budget`: the run's tenant's (`budget_of`), read by the caller; `price`:
    the agent's model's, if the caller read it."""
    agent = run.agent
    if price is None:
        price = model_price_for(model=agent.model, tenant_id=run.tenant_id)
    # A ceiling lowered mid-run applies from the next step on; approved budget
    # extensions raise the caps from there.
    limits = limits_with_extensions(
        min_limits(BudgetLimits.from_dict(run.limits), run_ceiling_of(budget)),
        run.limit_extensions,
    )
    return RunRuntime(
        config=AgentConfig(
            name=agent.slug,
            system_prompt=agent.system_prompt,
            reserve_output_tokens=settings.RUN_RESERVE_OUTPUT_TOKENS,
            price=price.price,
            retry=RetryPolicy(
                max_per_tool=settings.RUN_TOOL_RETRIES,
                backoff_seconds=settings.RUN_TOOL_RETRY_BACKOFF_SECONDS,
            ),
        ),
        registry=tool_registry_for(agent.tool_names, tenant_id=run.tenant_id),
        model=model_adapter_for(agent, replies_consumed=replies_consumed),
        policy=import_string(settings.RUN_POLICY_HOOK),
        limits=limits,
        evaluator=evaluator_for(agent.evaluator),
        price_known=price.known,
        budget=budget,
    )
