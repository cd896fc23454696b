"""Agents for tests, made the way an admin makes them: through the services that
validate and version them (runs.services.agents)."""

from __future__ import annotations

from typing import Any

from runs.models import Agent, ModelEndpoint
from runs.services.agents import agent_create, model_endpoint_create


def endpoint_for(
    tenant: Any,
    *,
    kind: str = "scripted",
    base_url: str = "",
    api_key_secret: str = "",
    options: dict[str, Any] | None = None,
    slug: str = "",
) -> ModelEndpoint:
    """The tenant's endpoint of this shape, created on first use."""
    found = ModelEndpoint.objects.filter(
        tenant=tenant, kind=kind, base_url=base_url, api_key_secret=api_key_secret
    )
    if slug:
        found = found.filter(slug=slug)
    endpoint = found.first()
    if endpoint is not None:
        return endpoint
    taken = set(
        ModelEndpoint.objects.filter(tenant=tenant).values_list("slug", flat=True)
    )
    slug = slug or kind
    n = 1
    while slug in taken:
        n += 1
        slug = f"{kind}-{n}"
    return model_endpoint_create(
        tenant=tenant,
        actor=None,
        data={
            "slug": slug,
            "name": slug,
            "kind": kind,
            "base_url": base_url,
            "api_key_secret": api_key_secret,
            "options": options or {},
        },
    )


def make_agent(
    tenant: Any,
    slug: str,
    *,
    kind: str = "scripted",
    model: str = "scripted",
    tools: list[str] | None = None,
    script: list[dict[str, Any]] | None = None,
    base_url: str = "",
    api_key_secret: str = "",
    options: dict[str, Any] | None = None,
    actor: Any = None,
    **config: Any,
) -> Agent:
    """An agent and its version 1 on an endpoint of `kind` (made if missing)."""
    endpoint = endpoint_for(
        tenant,
        kind=kind,
        base_url=base_url,
        api_key_secret=api_key_secret,
        options=options,
    )
    config.setdefault("name", slug)
    return agent_create(
        tenant=tenant,
        actor=actor,
        slug=slug,
        config={
            "endpoint": endpoint.slug,
            "model": model,
            "tools": list(tools or []),
            "script": list(script or []),
            **config,
        },
    )
