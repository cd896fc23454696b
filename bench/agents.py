"""Scripted agents for benchmarks, made through the services an admin's edit goes
through (a version 1 on the tenant's scripted endpoint)."""

from __future__ import annotations

from typing import Any


def scripted_agent(
    tenant: Any,
    slug: str,
    *,
    tools: list[str] | None = None,
    script: list[dict[str, Any]] | None = None,
    default_limits: dict[str, Any] | None = None,
) -> Any:
    from runs.models import ModelEndpoint
    from runs.services.agents import agent_create, model_endpoint_create

    if not ModelEndpoint.objects.filter(tenant=tenant, slug="scripted").exists():
        model_endpoint_create(
            tenant=tenant,
            actor=None,
            data={"slug": "scripted", "name": "Scripted", "kind": "scripted"},
        )
    return agent_create(
        tenant=tenant,
        actor=None,
        slug=slug,
        config={
            "name": slug,
            "endpoint": "scripted",
            "model": "scripted",
            "tools": tools or [],
            "script": script or [],
            "default_limits": default_limits or {},
        },
    )
