"""Each agent's flat configuration becomes a model endpoint and its version 1, and
every existing run is pinned to it.

Agents of a tenant that reached a model the same way (adapter, base URL, key
variable) share one endpoint. The key was the name of an environment variable
(`api_key_env`); keys now live in the tenant's secret store, so the variable's
name becomes the endpoint's secret name (`api_key_secret`) when it is a valid
one: until an admin stores the key under that name, the agent's runs fail at
once with a model error naming the missing secret (docs/agents.md).
"""

from __future__ import annotations

import re
from typing import Any

from django.db import migrations

SECRET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def _endpoint_slug(kind: str, taken: set[str]) -> str:
    slug, n = kind, 1
    while slug in taken:
        n += 1
        slug = f"{kind}-{n}"
    taken.add(slug)
    return slug


def forwards(apps: Any, schema_editor: Any) -> None:
    Agent = apps.get_model("runs", "Agent")
    AgentVersion = apps.get_model("runs", "AgentVersion")
    ModelEndpoint = apps.get_model("runs", "ModelEndpoint")
    Run = apps.get_model("runs", "Run")
    endpoints: dict[tuple[Any, str, str, str], Any] = {}
    slugs: dict[Any, set[str]] = {}
    for agent in Agent.objects.order_by("tenant_id", "created_at"):
        kind = agent.model_adapter or "scripted"
        key_name = agent.api_key_env if SECRET_NAME.match(agent.api_key_env) else ""
        key = (agent.tenant_id, kind, agent.base_url, key_name)
        endpoint = endpoints.get(key)
        if endpoint is None:
            taken = slugs.setdefault(agent.tenant_id, set())
            slug = _endpoint_slug(kind, taken)
            endpoint = endpoints[key] = ModelEndpoint.objects.create(
                tenant_id=agent.tenant_id,
                slug=slug,
                name=f"{kind} ({slug})" if slug != kind else kind,
                kind=kind,
                base_url=agent.base_url,
                api_key_secret=key_name,
                options={},
            )
        version = AgentVersion.objects.create(
            agent=agent,
            number=1,
            name=agent.name,
            endpoint=endpoint,
            model=agent.model,
            system_prompt=agent.system_prompt,
            tools=list(agent.tool_names or []),
            tool_settings={},
            default_limits=dict(agent.default_limits or {}),
            evaluator=agent.evaluator,
            script=list(agent.script or []),
            evaluated_models=[agent.model] if agent.model else [],
        )
        Agent.objects.filter(id=agent.id).update(current_version=version)
        Run.objects.filter(agent_id=agent.id).update(agent_version=version)


def backwards(apps: Any, schema_editor: Any) -> None:
    Agent = apps.get_model("runs", "Agent")
    AgentVersion = apps.get_model("runs", "AgentVersion")
    for agent in Agent.objects.exclude(current_version=None):
        version = AgentVersion.objects.select_related("endpoint").get(
            id=agent.current_version_id
        )
        Agent.objects.filter(id=agent.id).update(
            model_adapter=version.endpoint.kind,
            model=version.model,
            base_url=version.endpoint.base_url,
            api_key_env=version.endpoint.api_key_secret,
            system_prompt=version.system_prompt,
            tool_names=version.tools,
            default_limits=version.default_limits,
            evaluator=version.evaluator,
            script=version.script,
        )
    apps.get_model("runs", "Run").objects.update(agent_version=None)
    Agent.objects.update(current_version=None)
    AgentVersion.objects.all().delete()
    apps.get_model("runs", "ModelEndpoint").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [("runs", "0009_agent_versions_and_model_endpoints")]

    operations = [migrations.RunPython(forwards, backwards)]
