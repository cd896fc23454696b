"""A run's model client: its endpoint's adapter behind the endpoint's circuit
breaker, with the agent version's fallback endpoint (spec §1.7).

- Streaming is on by default for `openai` and `anthropic` endpoints (an
  endpoint's `stream: false` turns it off); the step relays the text live.
- The breaker's state is shared by every worker (runs.breaker, Redis); its
  threshold and cool-down come from the endpoint's options
  (`breaker_failures`, default 3; `breaker_cooldown_seconds`, default 30).
- With a fallback, the primary gets `PRIMARY_SHARE` of the call's deadline, so a
  primary that times out leaves the fallback time to answer; while the circuit
  is open the fallback gets the whole deadline. The fallback endpoint has its own
  circuit (without a fallback of its own).
- A scripted endpoint answers from the version's script: no breaker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from runs.breaker import breaker_key, breaker_store
from runs.engine.adapters import ModelAdapter, build_model_adapter
from runs.engine.adapters.breaker import BreakerSettings, CircuitBreakerModel, Endpoint

__all__ = [
    "ADAPTER_OPTIONS",
    "BREAKER_OPTIONS",
    "PRIMARY_SHARE",
    "endpoint_adapter",
    "routed_model",
]

# The endpoint options the adapters take, and those the breaker reads.
ADAPTER_OPTIONS = ("timeout_seconds", "max_retries", "stream")
BREAKER_OPTIONS = ("breaker_failures", "breaker_cooldown_seconds")
STREAMING_KINDS = frozenset({"openai", "anthropic"})
PRIMARY_SHARE = 0.6


class EndpointRow(Protocol):
    """What is read of a `runs.models.ModelEndpoint`."""

    @property
    def pk(self) -> Any: ...

    slug: str
    kind: str
    base_url: str
    options: Any


def endpoint_adapter(
    endpoint: EndpointRow,
    *,
    model: str,
    api_key: str,
    deadline_seconds: float,
    script: Sequence[Mapping[str, Any]] = (),
    script_position: int = 0,
) -> ModelAdapter:
    """The endpoint's adapter for one model (raises what the SDK raises for a
    configuration it refuses)."""
    options = {
        name: value
        for name, value in dict(endpoint.options or {}).items()
        if name in ADAPTER_OPTIONS
    }
    if endpoint.kind in STREAMING_KINDS:
        options.setdefault("stream", True)
    return build_model_adapter(
        endpoint.kind,
        model=model,
        script=script,
        script_position=script_position,
        api_key=api_key,
        base_url=endpoint.base_url or None,
        deadline_seconds=deadline_seconds,
        options=options,
    )


def _endpoint(
    adapter: ModelAdapter, endpoint: EndpointRow, model: str, tenant_id: Any
) -> Endpoint:
    key = breaker_key(tenant_id=tenant_id, endpoint_id=endpoint.pk, model=model)
    return Endpoint(adapter, endpoint.slug, model, key)


def routed_model(
    primary: ModelAdapter,
    *,
    endpoint: EndpointRow,
    model: str,
    tenant_id: Any,
    deadline_seconds: float,
    fallback: tuple[ModelAdapter, EndpointRow, str] | None = None,
) -> ModelAdapter:
    """`primary` (built by `endpoint_adapter`) behind its circuit breaker, with
    the fallback's adapter, endpoint and model if the version has one."""
    if endpoint.kind == "scripted":
        return primary
    store = breaker_store()
    routed_fallback = None
    if fallback is not None:
        adapter, fallback_endpoint, fallback_model = fallback
        guarded = CircuitBreakerModel(
            _endpoint(adapter, fallback_endpoint, fallback_model, tenant_id),
            store=store,
            settings=BreakerSettings.from_options(fallback_endpoint.options),
        )
        routed_fallback = Endpoint(
            guarded,
            fallback_endpoint.slug,
            fallback_model,
            breaker_key(
                tenant_id=tenant_id,
                endpoint_id=fallback_endpoint.pk,
                model=fallback_model,
            ),
        )
        if hasattr(primary, "deadline_seconds"):
            primary.deadline_seconds = deadline_seconds * PRIMARY_SHARE
    return CircuitBreakerModel(
        _endpoint(primary, endpoint, model, tenant_id),
        store=store,
        settings=BreakerSettings.from_options(endpoint.options),
        fallback=routed_fallback,
        deadline_seconds=deadline_seconds,
    )
