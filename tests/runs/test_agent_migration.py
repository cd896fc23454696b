"""The migration that turns each flat agent into a model endpoint and version 1,
and pins every existing run to it (runs 0009-0011)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("runs", "0008_mcp_tool_quota")]
AFTER = [("runs", "0011_agent_flat_fields_removed")]


def _migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_each_agent_becomes_an_endpoint_and_version_1_pinned_by_its_runs() -> None:
    old = _migrate(BEFORE)
    try:
        tenant = old.get_model("controlplane", "Tenant").objects.create(
            slug="migrated", name="Migrated"
        )
        Agent = old.get_model("runs", "Agent")
        common = {"tenant": tenant, "system_prompt": "Be brief.", "evaluator": ""}
        remote = Agent.objects.create(
            id=uuid.uuid4(), slug="remote", name="Remote", model_adapter="openai",
            model="gpt-4o-mini", base_url="http://llm.internal/v1",
            api_key_env="OPENAI_API_KEY", tool_names=["lookup_order"],
            default_limits={"max_steps": 7}, **common,
        )  # fmt: skip
        twin = Agent.objects.create(
            id=uuid.uuid4(), slug="twin", name="Twin", model_adapter="openai",
            model="gpt-4o", base_url="http://llm.internal/v1",
            api_key_env="OPENAI_API_KEY", **common,
        )  # fmt: skip
        scripted = Agent.objects.create(
            id=uuid.uuid4(), slug="scripted", name="Scripted",
            model_adapter="scripted", model="scripted",
            script=[{"text": "hi"}], api_key_env="not a name!", **common,
        )  # fmt: skip
        run = old.get_model("runs", "Run").objects.create(
            id=uuid.uuid4(), tenant=tenant, agent=remote, input="x"
        )
        new = _migrate(AFTER)
        Version = new.get_model("runs", "AgentVersion")
        v_remote = Version.objects.get(agent_id=remote.id)
        assert v_remote.number == 1
        assert (v_remote.model, v_remote.tools, v_remote.default_limits) == (
            "gpt-4o-mini",
            ["lookup_order"],
            {"max_steps": 7},
        )
        assert v_remote.system_prompt == "Be brief."
        # The key's variable name becomes the secret name an admin sets.
        endpoint = v_remote.endpoint
        assert (endpoint.kind, endpoint.base_url, endpoint.api_key_secret) == (
            "openai",
            "http://llm.internal/v1",
            "OPENAI_API_KEY",
        )
        # Agents reaching a model the same way share the endpoint.
        assert Version.objects.get(agent_id=twin.id).endpoint_id == endpoint.id
        v_scripted = Version.objects.get(agent_id=scripted.id)
        assert v_scripted.script == [{"text": "hi"}]
        assert v_scripted.endpoint.api_key_secret == ""  # not a valid name: dropped
        assert v_scripted.endpoint.kind == "scripted"
        NewAgent = new.get_model("runs", "Agent")
        assert NewAgent.objects.get(id=remote.id).current_version_id == v_remote.id
        pinned = new.get_model("runs", "Run").objects.get(id=run.id)
        assert pinned.agent_version_id == v_remote.id
    finally:
        _migrate(
            [
                (app, leaf)
                for app, leaf in MigrationExecutor(connection).loader.graph.leaf_nodes()
            ]
        )
