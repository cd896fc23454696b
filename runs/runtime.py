"""Build the engine parts of a run: model adapter, tools, policy, limits, evaluator."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from runs.engine.adapters import ModelAdapter, build_model_adapter
from runs.engine.budget import BudgetLimits
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


def effective_limits(agent: Agent, requested: dict[str, Any]) -> BudgetLimits:
    """The run's caps: the lowest of the platform default, the agent's and the run's.

    A run request may lower a cap but never raise it.
    """
    layers = [
        BudgetLimits.from_dict(settings.RUN_DEFAULT_LIMITS),
        BudgetLimits.from_dict(agent.default_limits),
        BudgetLimits.from_dict(requested),
    ]
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
    )


def runtime_for(run: Run, *, replies_consumed: int) -> RunRuntime:
    agent = run.agent
    return RunRuntime(
        config=AgentConfig(
            name=agent.slug,
            system_prompt=agent.system_prompt,
            reserve_output_tokens=settings.RUN_RESERVE_OUTPUT_TOKENS,
        ),
        registry=tool_registry_for(agent.tool_names),
        model=model_adapter_for(agent, replies_consumed=replies_consumed),
        policy=import_string(settings.RUN_POLICY_HOOK),
        limits=BudgetLimits.from_dict(run.limits),
        evaluator=evaluator_for(agent.evaluator, run=run),
    )
