"""Build the engine parts of a run: model adapter, tools, policy, limits, evaluator."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from budgets.extensions import limits_with_extensions
from budgets.models import Budget
from budgets.prices import PriceLookup, model_price_for, unknown_price_refused
from budgets.services import run_ceiling_of
from controlplane.secrets import SecretMissing, secret_value
from runs.engine.actions import ModelReply
from runs.engine.adapters import (
    DeltaSink,
    ModelAdapter,
    ModelError,
)
from runs.engine.budget import BudgetLimits, ModelPrice
from runs.engine.disclosure import skills_from
from runs.engine.enforcement import RetryPolicy
from runs.engine.evaluator import Evaluator
from runs.engine.guardrails import GuardrailSpec
from runs.engine.loop import AgentConfig
from runs.engine.policy import PolicyHook
from runs.engine.tools import ToolRegistry
from runs.evaluators import evaluator_for
from runs.model_routing import endpoint_adapter, routed_model
from runs.models import AgentVersion, ModelEndpoint, Run
from runs.tools.registry import tool_registry_for
from runs.tools.subagents import subagent_tools_for

# What an endpoint without a key secret (a local vLLM, Ollama or LM Studio) is
# sent as its key: the SDKs refuse to build a client with none.
NO_API_KEY = "no-key"


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
    # The fallback model's price (None: no fallback); a reply's cost is priced
    # by the model that answered it.
    fallback_price: ModelPrice | None = None
    # The model's window (price table; None: unknown) and the share of it above
    # which the context is compacted before a call (the version's setting).
    context_window: int | None = None
    compaction_threshold: float = 0.8

    def price_of(self, reply: ModelReply | ModelError) -> ModelPrice:
        routing = getattr(reply, "routing", None) or {}
        if routing.get("fallback_used") and self.fallback_price is not None:
            return self.fallback_price
        return self.config.price


def effective_limits(
    version: AgentVersion,
    requested: dict[str, Any],
    ceiling: BudgetLimits | None = None,
) -> BudgetLimits:
    """The run's caps: the lowest of the platform default, the tenant's ceiling, the
    agent's and the run's.

    An agent version or a run request may lower a cap but never raise it; a
    request above the tenant's ceiling is an error (ValueError naming the cap).
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
        BudgetLimits.from_dict(version.default_limits),
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


class UnavailableModel:
    """The model of a version whose client cannot be built (its key secret is
    not set, the SDK refuses the configuration): the first call fails with the
    reason, so the run ends at once with a model error saying what to fix, in
    its stop detail and in its chat span."""

    def __init__(self, provider: str, error: ModelError) -> None:
        self._provider = provider
        self.error = error

    @property
    def provider(self) -> str:
        return self._provider

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        max_output_tokens: int,
        *,
        on_delta: DeltaSink | None = None,
    ) -> ModelReply:
        raise self.error


def _endpoint_client(
    endpoint: ModelEndpoint,
    model: str,
    *,
    tenant_id: Any,
    script: Sequence[Mapping[str, Any]],
    replies_consumed: int,
    deadline_seconds: float | None = None,
) -> ModelAdapter:
    """One endpoint's adapter for one model, with its key from the tenant's
    secret store; an `UnavailableModel` when it cannot be built."""
    api_key = NO_API_KEY
    if endpoint.api_key_secret:
        try:
            api_key = secret_value(tenant_id=tenant_id, name=endpoint.api_key_secret)
        except SecretMissing as missing:  # unreadable ones too: the message says
            return UnavailableModel(
                endpoint.kind,
                ModelError(
                    "missing_secret",
                    f"the key of model endpoint {endpoint.slug!r}: {missing}; an "
                    "admin sets it on the Secrets page",
                ),
            )
    try:
        return endpoint_adapter(
            endpoint,
            model=model,
            api_key=api_key,
            deadline_seconds=deadline_seconds or settings.RUN_MODEL_DEADLINE_SECONDS,
            script=script,
            script_position=replies_consumed,
        )
    # The SDKs raise their own exception types for a configuration they refuse.
    except Exception as exc:  # noqa: BLE001 - reported as the run's model error
        return UnavailableModel(
            endpoint.kind,
            ModelError(
                "configuration",
                f"the model client of endpoint {endpoint.slug!r} could not be "
                f"built: {exc}",
            ),
        )


def guardrail_model_for(
    spec: GuardrailSpec, *, tenant_id: Any
) -> ModelAdapter | ModelError:
    """The small model a guardrail asks (no breaker, no fallback: a guardrail
    that cannot ask its model fails closed); the error when it cannot be built."""
    endpoint = ModelEndpoint.objects.filter(tenant_id=tenant_id, slug=spec.endpoint)
    row = endpoint.first()
    if row is None:
        return ModelError(
            "configuration", f"no model endpoint {spec.endpoint!r} in this tenant"
        )
    client = _endpoint_client(
        row, spec.model, tenant_id=tenant_id, script=spec.script,
        replies_consumed=0, deadline_seconds=spec.timeout_seconds,
    )  # fmt: skip
    if isinstance(client, UnavailableModel):
        return client.error
    return client


def model_adapter_for(
    version: AgentVersion,
    *,
    tenant_id: Any,
    replies_consumed: int,
    with_fallback: bool = True,
) -> ModelAdapter:
    """The model client of the version's endpoint (streaming, behind the
    endpoint's circuit breaker, runs.model_routing), with the version's fallback
    endpoint and model unless `with_fallback` is False; an `UnavailableModel`
    when the primary cannot be built (a key secret that is not set: the run's
    model error names it, and no fallback hides it)."""
    primary = _endpoint_client(
        version.endpoint, version.model, tenant_id=tenant_id,
        script=version.script, replies_consumed=replies_consumed,
    )  # fmt: skip
    if isinstance(primary, UnavailableModel):
        return primary
    fallback = None
    if with_fallback and version.fallback_endpoint_id and version.fallback_model:
        assert version.fallback_endpoint is not None
        backup = _endpoint_client(
            version.fallback_endpoint, version.fallback_model, tenant_id=tenant_id,
            script=version.script, replies_consumed=replies_consumed,
        )  # fmt: skip
        fallback = (backup, version.fallback_endpoint, version.fallback_model)
    return routed_model(
        primary,
        endpoint=version.endpoint,
        model=version.model,
        tenant_id=tenant_id,
        deadline_seconds=settings.RUN_MODEL_DEADLINE_SECONDS,
        fallback=fallback,
    )


def runtime_for(
    run: Run,
    *,
    replies_consumed: int,
    budget: Budget | None,
    price: PriceLookup | None = None,
) -> RunRuntime:
    """`budget`: the run's tenant's (`budget_of`), read by the caller; `price`:
    the version's model's, if the caller read it. Everything comes from the
    version the run pinned at its start, never from the agent's current one."""
    version = run.agent_version
    if version is None:
        raise ValueError(f"run {run.id} has no agent version: it is not run here")
    if price is None:
        price = model_price_for(model=version.model, tenant_id=run.tenant_id)
    fallback_price = None
    with_fallback = bool(version.fallback_endpoint_id and version.fallback_model)
    if with_fallback:
        fallback_price = model_price_for(
            model=version.fallback_model, tenant_id=run.tenant_id
        )
        # A fallback of unknown price is not used where that price could break a
        # cost cap (the unknown-price rule); the circuit then fails fast.
        with_fallback = fallback_price.known or not unknown_price_refused(
            budget=budget, run_limits=run.limits
        )
    # A ceiling lowered mid-run applies from the next step on; approved budget
    # extensions raise the caps from there.
    limits = limits_with_extensions(
        min_limits(BudgetLimits.from_dict(run.limits), run_ceiling_of(budget)),
        run.limit_extensions,
    )
    registry = tool_registry_for(
        version.tools,
        tenant_id=run.tenant_id,
        tool_settings=version.tool_settings,
        skills=skills_from(version.skills),
    )
    # Agents as tools: each listed agent of the tenant (runs.services.subagents).
    for tool in subagent_tools_for(version.subagents, tenant_id=run.tenant_id):
        if registry.get(tool.name) is None:
            registry.register(tool)
    return RunRuntime(
        config=AgentConfig(
            name=run.agent.slug,
            system_prompt=version.system_prompt,
            skills=skills_from(version.skills),
            reserve_output_tokens=settings.RUN_RESERVE_OUTPUT_TOKENS,
            price=price.price,
            retry=RetryPolicy(
                max_per_tool=settings.RUN_TOOL_RETRIES,
                backoff_seconds=settings.RUN_TOOL_RETRY_BACKOFF_SECONDS,
            ),
        ),
        registry=registry,
        model=model_adapter_for(
            version,
            tenant_id=run.tenant_id,
            replies_consumed=replies_consumed,
            with_fallback=with_fallback,
        ),
        policy=import_string(settings.RUN_POLICY_HOOK),
        limits=limits,
        evaluator=evaluator_for(version.evaluator),
        price_known=price.known,
        budget=budget,
        fallback_price=fallback_price.price if fallback_price else None,
        context_window=price.context_window_tokens,
        compaction_threshold=version.compaction_threshold,
    )
