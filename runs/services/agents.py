"""Writes for agents and model endpoints: every edit of an agent is a new
version, every change is audited, and nothing is half-written on error.

A run pins the version it started with (`Run.agent_version`); deleting an agent
is soft, so its runs keep their versions (docs/agents.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Max, Q
from django.utils import timezone

from controlplane.models import Tenant
from controlplane.services import audit_record
from runs.models import Agent, AgentVersion, ModelEndpoint
from runs.services.agent_validation import (
    DefinitionError,
    agent_config_validate,
    endpoint_validate,
    slug_problem,
    version_config_of,
)

__all__ = [
    "DefinitionError",
    "EndpointInUse",
    "agent_create",
    "agent_delete",
    "agent_set_disabled",
    "agent_update",
    "agent_version_restore",
    "model_endpoint_create",
    "model_endpoint_delete",
    "model_endpoint_update",
]


class EndpointInUse(Exception):
    """An endpoint that agent versions refer to cannot be deleted."""


def _audit(
    *,
    tenant: Tenant,
    actor: User | None,
    action: str,
    object_type: str,
    object_id: Any,
    before: Any = None,
    after: Any = None,
    remote_addr: str | None = None,
) -> None:
    audit_record(
        tenant=tenant,
        actor=actor,
        action=action,
        object_type=object_type,
        object_id=str(object_id),
        before=before,
        after=after,
        remote_addr=remote_addr,
    )


def _version_create(
    *, agent: Agent, fields: dict[str, Any], actor: User | None
) -> AgentVersion:
    """Version n+1 of the agent (whose row the caller holds locked), made current."""
    latest = agent.versions.aggregate(top=Max("number"))["top"] or 0
    version = AgentVersion.objects.create(
        agent=agent, number=latest + 1, created_by=actor, **fields
    )
    Agent.objects.filter(pk=agent.pk).update(
        current_version=version, name=version.name, updated_at=timezone.now()
    )
    agent.current_version = version
    agent.name = version.name
    return version


def _audit_view(version: AgentVersion) -> dict[str, Any]:
    config = version_config_of(version)
    # A skill's body (up to 64 KB each) is named by its digest: the version
    # holds the text, the audit log says which text it was.
    config["skills"] = [
        {
            "name": skill["name"],
            "summary": skill["summary"],
            "body_sha256": hashlib.sha256(skill["body"].encode()).hexdigest(),
        }
        for skill in config["skills"]
    ]
    return {"version": version.number, **config}


@transaction.atomic
def agent_create(
    *,
    tenant: Tenant,
    actor: User | None,
    slug: Any,
    config: Mapping[str, Any],
    remote_addr: str | None = None,
) -> Agent:
    """A new agent and its version 1; DefinitionError names what is wrong."""
    problems: dict[str, list[str]] = {}
    if (why := slug_problem(slug)) is not None:
        problems["slug"] = [why]
    elif Agent.objects.filter(
        tenant=tenant, slug=slug, deleted_at__isnull=True
    ).exists():
        problems["slug"] = [f"this tenant has an agent {slug!r}"]
    try:
        fields = agent_config_validate(tenant=tenant, data=config, agent_slug=str(slug))
    except DefinitionError as invalid:
        raise DefinitionError({**problems, **invalid.fields}) from None
    if problems:
        raise DefinitionError(problems)
    try:
        with transaction.atomic():
            agent = Agent.objects.create(tenant=tenant, slug=slug, name=fields["name"])
    except IntegrityError:  # created concurrently under the same slug
        raise DefinitionError(
            {"slug": [f"this tenant has an agent {slug!r}"]}
        ) from None
    version = _version_create(agent=agent, fields=fields, actor=actor)
    _audit(
        tenant=tenant, actor=actor, action="agent.create", object_type="agent",
        object_id=agent.id, after={"slug": slug, **_audit_view(version)},
        remote_addr=remote_addr,
    )  # fmt: skip
    return agent


def _locked(agent: Agent) -> Agent:
    return (
        # Only the agent's row is locked: its version joins are outer joins,
        # which PostgreSQL cannot lock.
        Agent.objects.select_for_update(of=("self",))
        .select_related(
            "current_version__endpoint", "current_version__fallback_endpoint"
        )
        .get(pk=agent.pk, deleted_at__isnull=True)
    )


@transaction.atomic
def agent_update(
    *,
    agent: Agent,
    actor: User | None,
    config: Mapping[str, Any],
    partial: bool,
    remote_addr: str | None = None,
) -> AgentVersion | None:
    """A new version from `config` (over the current one when `partial`); None
    when it would equal the current version (nothing is written)."""
    agent = _locked(agent)
    current = agent.current_version
    if current is None:
        raise DefinitionError({"agent": ["this agent records runs sent over OTLP"]})
    base = version_config_of(current)
    fields = agent_config_validate(
        tenant=agent.tenant,
        data=config,
        base=base if partial else None,
        agent_slug=agent.slug,
    )
    if _same(fields, base):
        return None
    version = _version_create(agent=agent, fields=fields, actor=actor)
    _audit(
        tenant=agent.tenant, actor=actor, action="agent.update", object_type="agent",
        object_id=agent.id, before=_audit_view(current), after=_audit_view(version),
        remote_addr=remote_addr,
    )  # fmt: skip
    return version


def _same(fields: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    def slug_of(endpoint: ModelEndpoint | None) -> str | None:
        return endpoint.slug if endpoint is not None else None

    written = {
        **fields,
        "endpoint": slug_of(fields["endpoint"]),
        "fallback_endpoint": slug_of(fields["fallback_endpoint"]),
    }
    return all(written[name] == config[name] for name in AgentVersion.CONFIG_FIELDS)


@transaction.atomic
def agent_version_restore(
    *,
    agent: Agent,
    number: int,
    actor: User | None,
    remote_addr: str | None = None,
) -> AgentVersion:
    """A new version equal to version `number` (its endpoints must still exist,
    as they do: an endpoint a version uses cannot be deleted)."""
    agent = _locked(agent)
    old = agent.versions.select_related("endpoint", "fallback_endpoint").get(
        number=number
    )
    fields = agent_config_validate(
        tenant=agent.tenant, data=version_config_of(old), agent_slug=agent.slug
    )
    current = agent.current_version
    version = _version_create(agent=agent, fields=fields, actor=actor)
    _audit(
        tenant=agent.tenant, actor=actor, action="agent.restore", object_type="agent",
        object_id=agent.id,
        before=None if current is None else _audit_view(current),
        after={"restored_from": number, **_audit_view(version)},
        remote_addr=remote_addr,
    )  # fmt: skip
    return version


@transaction.atomic
def agent_set_disabled(
    *, agent: Agent, actor: User | None, disabled: bool, remote_addr: str | None = None
) -> Agent:
    """Disable (no new runs start; running ones go on) or enable the agent."""
    agent = _locked(agent)
    if agent.disabled != disabled:
        Agent.objects.filter(pk=agent.pk).update(
            disabled=disabled, updated_at=timezone.now()
        )
        _audit(
            tenant=agent.tenant, actor=actor,
            action="agent.disable" if disabled else "agent.enable",
            object_type="agent", object_id=agent.id,
            before={"disabled": agent.disabled}, after={"disabled": disabled},
            remote_addr=remote_addr,
        )  # fmt: skip
        agent.disabled = disabled
    return agent


@transaction.atomic
def agent_delete(
    *, agent: Agent, actor: User | None, remote_addr: str | None = None
) -> None:
    """Delete the agent softly: it is gone from lists and cannot start runs, its
    slug is free again, and its runs keep the versions they pinned."""
    agent = _locked(agent)
    Agent.objects.filter(pk=agent.pk).update(deleted_at=timezone.now())
    _audit(
        tenant=agent.tenant, actor=actor, action="agent.delete", object_type="agent",
        object_id=agent.id, before={"slug": agent.slug, "disabled": agent.disabled},
        remote_addr=remote_addr,
    )  # fmt: skip


def _endpoint_view(endpoint: ModelEndpoint) -> dict[str, Any]:
    return {
        "slug": endpoint.slug,
        "name": endpoint.name,
        "kind": endpoint.kind,
        "base_url": endpoint.base_url,
        "api_key_secret": endpoint.api_key_secret,  # a name, never a value
        "options": endpoint.options,
    }


@transaction.atomic
def model_endpoint_create(
    *,
    tenant: Tenant,
    actor: User | None,
    data: Mapping[str, Any],
    remote_addr: str | None = None,
) -> ModelEndpoint:
    fields = endpoint_validate(tenant=tenant, data=data)
    try:
        with transaction.atomic():
            endpoint = ModelEndpoint.objects.create(tenant=tenant, **fields)
    except IntegrityError:
        raise DefinitionError(
            {"slug": [f"this tenant has an endpoint {fields['slug']!r}"]}
        ) from None
    _audit(
        tenant=tenant, actor=actor, action="model_endpoint.create",
        object_type="model_endpoint", object_id=endpoint.id,
        after=_endpoint_view(endpoint), remote_addr=remote_addr,
    )  # fmt: skip
    return endpoint


@transaction.atomic
def model_endpoint_update(
    *,
    endpoint: ModelEndpoint,
    actor: User | None,
    data: Mapping[str, Any],
    partial: bool,
    remote_addr: str | None = None,
) -> ModelEndpoint:
    """Edit the endpoint in place: it is where versions reach their model (its
    URL, key secret, options), not part of a version, so the runs of every
    version that uses it reach the model the new way from their next step."""
    endpoint = ModelEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    before = _endpoint_view(endpoint)
    fields = endpoint_validate(
        tenant=endpoint.tenant, data=data, instance=endpoint, partial=partial
    )
    for name, value in fields.items():
        setattr(endpoint, name, value)
    try:
        with transaction.atomic():
            endpoint.save()
    except IntegrityError:
        raise DefinitionError(
            {"slug": [f"this tenant has an endpoint {fields['slug']!r}"]}
        ) from None
    _audit(
        tenant=endpoint.tenant, actor=actor, action="model_endpoint.update",
        object_type="model_endpoint", object_id=endpoint.id, before=before,
        after=_endpoint_view(endpoint), remote_addr=remote_addr,
    )  # fmt: skip
    return endpoint


@transaction.atomic
def model_endpoint_delete(
    *, endpoint: ModelEndpoint, actor: User | None, remote_addr: str | None = None
) -> None:
    """Delete an endpoint no agent version uses (EndpointInUse names them)."""
    endpoint = ModelEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    users = (
        AgentVersion.objects.filter(
            Q(endpoint=endpoint) | Q(fallback_endpoint=endpoint)
        )
        .select_related("agent")
        .order_by("agent__slug", "number")
    )
    names = sorted({f"{v.agent.slug} v{v.number}" for v in users[:20]})
    if names:
        raise EndpointInUse(
            f"endpoint {endpoint.slug!r} is used by agent versions "
            f"{', '.join(names)}; runs pinned to them need it"
        )
    _audit(
        tenant=endpoint.tenant, actor=actor, action="model_endpoint.delete",
        object_type="model_endpoint", object_id=endpoint.id,
        before=_endpoint_view(endpoint), remote_addr=remote_addr,
    )  # fmt: skip
    endpoint.delete()
