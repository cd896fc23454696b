"""The agents API: admins define agents and model endpoints, every edit is a new
version, runs pin theirs; bad input is a 400 naming the field with nothing
written; other roles read; other tenants see nothing."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.models import AuditEvent
from controlplane.secrets import secret_set
from runs.models import Agent, AgentVersion, ModelEndpoint, Run
from tests.agents import endpoint_for

AGENT = {
    "slug": "support",
    "name": "Support",
    "endpoint": "local",
    "model": "scripted",
    "system_prompt": "Be kind.",
    "tools": ["lookup_order", "create_replacement"],
    "script": [{"text": "Hello."}],
}


@pytest.fixture
def admin_api(tenant, admin_user, api_client_for):
    return api_client_for(admin_user, tenant)


@pytest.fixture
def endpoint(admin_api) -> dict[str, Any]:
    response = admin_api.post(
        "/api/v1/model-endpoints/",
        {"slug": "local", "name": "Local scripted", "kind": "scripted"},
        format="json",
    )
    assert response.status_code == 201, response.json()
    return dict(response.json())


@pytest.fixture
def agent(admin_api, endpoint) -> dict[str, Any]:
    response = admin_api.post("/api/v1/agents/", AGENT, format="json")
    assert response.status_code == 201, response.json()
    return dict(response.json())


def test_an_admin_creates_an_agent_at_version_1_and_it_is_audited(agent):
    assert agent["version"] == 1 and agent["slug"] == "support"
    version = agent["current_version"]
    assert version["endpoint"] == "local"
    assert version["tools"] == ["lookup_order", "create_replacement"]
    assert version["created_by"] == "alice-admin"
    created = AuditEvent.objects.get(action="agent.create")
    assert created.object_id == agent["id"] and created.after["version"] == 1
    assert AuditEvent.objects.filter(action="model_endpoint.create").count() == 1


def test_every_edit_is_a_new_version_that_can_be_compared_and_restored(
    admin_api, agent
):
    url = f"/api/v1/agents/{agent['id']}/"
    edited = admin_api.patch(
        url, {"system_prompt": "Be brief.", "tools": ["lookup_order"]}, format="json"
    )
    assert edited.status_code == 200, edited.json()
    assert edited.json()["version"] == 2
    assert edited.json()["current_version"]["system_prompt"] == "Be brief."
    # Only what changed: the rest is kept from version 1.
    assert edited.json()["current_version"]["script"] == [{"text": "Hello."}]
    versions = admin_api.get(url + "versions/").json()
    assert [v["number"] for v in versions] == [2, 1]
    assert admin_api.get(url + "versions/1/").json()["system_prompt"] == "Be kind."
    compared = admin_api.get(url + "versions/compare/?a=1&b=2").json()
    assert compared["changes"] == [
        {"field": "system_prompt", "a": "Be kind.", "b": "Be brief."},
        {
            "field": "tools",
            "a": ["lookup_order", "create_replacement"],
            "b": ["lookup_order"],
        },
    ]
    restored = admin_api.post(url + "versions/1/restore/")
    assert restored.status_code == 201
    assert restored.json()["version"] == 3
    assert admin_api.get(url + "versions/compare/?a=1&b=3").json()["changes"] == []
    assert list(
        AuditEvent.objects.filter(object_id=agent["id"])
        .order_by("created_at")
        .values_list("action", flat=True)
    ) == ["agent.create", "agent.update", "agent.restore"]
    # A PUT replaces: what it leaves out takes its default.
    put = admin_api.put(
        url, {"name": "Support", "endpoint": "local", "model": "other"}, format="json"
    )
    assert put.status_code == 200
    assert (put.json()["version"], put.json()["current_version"]["tools"]) == (4, [])


def test_a_run_pins_the_version_it_started_with(admin_api, agent, operator_user):
    run = admin_api.post(
        "/api/v1/runs/", {"agent": "support", "input": "hi"}, format="json"
    ).json()
    assert run["agent_version"] == 1
    admin_api.patch(f"/api/v1/agents/{agent['id']}/", {"model": "m2"}, format="json")
    second = admin_api.post(
        "/api/v1/runs/", {"agent": "support", "input": "hi"}, format="json"
    ).json()
    assert second["agent_version"] == 2
    assert admin_api.get(f"/api/v1/runs/{run['id']}/").json()["agent_version"] == 1


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"tools": ["lookup_order", "no_such_tool"]}, "tools", "no_such_tool"),
        ({"tools": ["mcp:nowhere/thing"]}, "tools", "mcp:nowhere/thing"),
        ({"endpoint": "nowhere"}, "endpoint", "no model endpoint 'nowhere'"),
        ({"fallback_model": "gpt-x"}, "fallback_model", "not in evaluated_models"),
        (
            {"fallback_endpoint": "local", "evaluated_models": ["scripted"]},
            "fallback_model",
            "needs a fallback model",
        ),
        ({"default_limits": {"max_steps": -1}}, "default_limits", "max_steps"),
        ({"default_limits": {"max_banana": 3}}, "default_limits", "max_banana"),
        ({"evaluator": "vibes"}, "evaluator", "no evaluator 'vibes'"),
        (
            {"tool_settings": {"lookup_order": {"approval": "sometimes"}}},
            "tool_settings",
            "",
        ),
        ({"tool_settings": {"refund": {}}}, "tool_settings", "not one of"),
        (
            {"tool_settings": {"lookup_order": {"network": ["no-port"]}}},
            "tool_settings",
            "network[0]",
        ),
        (
            {
                "tool_settings": {
                    "lookup_order": {
                        "network": ["api.example.com:443"],
                        "credentials": {"api.example.com:443": {"secret": "NOT_SET"}},
                    }
                }
            },
            "tool_settings",
            "'NOT_SET' is not set in this tenant",
        ),
        (
            {"tool_settings": {"lookup_order": {"quota": 3}}},
            "tool_settings",
            "cost.quota",
        ),
        ({"tool_settings": ["lookup_order"]}, "tool_settings", ""),
        ({"name": "   "}, "name", ""),
        ({"slug": "Not a slug!"}, "slug", ""),
        ({"colour": "blue"}, "colour", "unknown field"),
        ({"script": "hello"}, "script", ""),
    ],
)
def test_a_bad_definition_is_a_400_naming_the_field_and_writes_nothing(
    admin_api, endpoint, change, field, words
):
    before = AuditEvent.objects.count()
    response = admin_api.post("/api/v1/agents/", {**AGENT, **change}, format="json")
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert field in error["fields"], error
    assert words in str(error["fields"][field])
    assert not Agent.objects.exists() and not AgentVersion.objects.exists()
    assert AuditEvent.objects.count() == before


def test_a_bad_edit_makes_no_version(admin_api, agent):
    url = f"/api/v1/agents/{agent['id']}/"
    response = admin_api.patch(url, {"tools": ["nope"]}, format="json")
    assert response.status_code == 400
    assert "tools" in response.json()["error"]["fields"]
    assert AgentVersion.objects.count() == 1
    assert not AuditEvent.objects.filter(action="agent.update").exists()


def test_a_taken_slug_is_refused(admin_api, agent):
    response = admin_api.post("/api/v1/agents/", AGENT, format="json")
    assert response.status_code == 400
    assert "slug" in response.json()["error"]["fields"]
    assert Agent.objects.count() == 1


def test_operators_and_viewers_read_but_may_not_change(
    agent, tenant, operator_user, viewer_user, api_client_for
):
    url = f"/api/v1/agents/{agent['id']}/"
    for user in (operator_user, viewer_user):
        api = api_client_for(user, tenant)
        assert api.get("/api/v1/agents/").status_code == 200
        assert api.get(url).status_code == 200
        assert api.get(url + "versions/").status_code == 200
        assert api.get("/api/v1/model-endpoints/").status_code == 200
        assert api.patch(url, {"model": "x"}, format="json").status_code == 403
        assert api.post(url + "disable/").status_code == 403
        assert api.delete(url).status_code == 403
        assert api.post(url + "versions/1/restore/").status_code == 403
        assert api.post("/api/v1/agents/", AGENT, format="json").status_code == 403
        body = {"slug": "x", "name": "x", "kind": "scripted"}
        assert (
            api.post("/api/v1/model-endpoints/", body, format="json").status_code == 403
        )
    assert AgentVersion.objects.count() == 1
    assert not Agent.objects.get().disabled
    assert ModelEndpoint.objects.count() == 1


def test_another_tenants_agent_and_endpoint_are_404(
    agent, endpoint, other_tenant, make_member, api_client_for
):
    stranger = api_client_for(make_member(other_tenant, "sam", "admin"), other_tenant)
    url = f"/api/v1/agents/{agent['id']}/"
    assert stranger.get(url).status_code == 404
    assert stranger.patch(url, {"model": "x"}, format="json").status_code == 404
    assert stranger.post(url + "disable/").status_code == 404
    assert stranger.delete(url).status_code == 404
    assert stranger.get(url + "versions/").status_code == 404
    assert stranger.get(url + "versions/1/").status_code == 404
    assert stranger.post(url + "versions/1/restore/").status_code == 404
    assert stranger.get("/api/v1/agents/").json() == []
    endpoint_url = f"/api/v1/model-endpoints/{endpoint['id']}/"
    assert stranger.get(endpoint_url).status_code == 404
    assert stranger.delete(endpoint_url).status_code == 404
    # Nor can its agents name our endpoint.
    response = stranger.post(
        "/api/v1/model-endpoints/",
        {"slug": "theirs", "name": "t", "kind": "scripted"},
        format="json",
    )
    assert response.status_code == 201
    assert stranger.post("/api/v1/agents/", AGENT, format="json").status_code == 400
    assert AgentVersion.objects.count() == 1
    assert not Agent.objects.get().disabled


def test_a_disabled_or_deleted_agent_cannot_start_a_run(admin_api, agent):
    url = f"/api/v1/agents/{agent['id']}/"
    start = {"agent": "support", "input": "hi"}
    assert admin_api.post(url + "disable/").json()["disabled"] is True
    refused = admin_api.post("/api/v1/runs/", start, format="json")
    assert refused.status_code == 400
    assert "disabled" in refused.json()["error"]["fields"]["agent"][0]
    assert admin_api.post(url + "enable/").json()["disabled"] is False
    kept = admin_api.post("/api/v1/runs/", start, format="json")
    assert kept.status_code == 201
    assert admin_api.delete(url).status_code == 204
    assert admin_api.get(url).status_code == 404
    assert admin_api.get("/api/v1/agents/").json() == []
    gone = admin_api.post("/api/v1/runs/", start, format="json")
    assert gone.status_code == 400 and "agent" in gone.json()["error"]["fields"]
    # The run keeps its agent and version; the slug may be used again.
    assert (
        admin_api.get(f"/api/v1/runs/{kept.json()['id']}/").json()["agent_version"] == 1
    )
    again = admin_api.post("/api/v1/agents/", AGENT, format="json")
    assert again.status_code == 201 and again.json()["version"] == 1
    assert Run.objects.count() == 1
    assert list(
        AuditEvent.objects.filter(object_id=agent["id"])
        .order_by("created_at")
        .values_list("action", flat=True)
    ) == ["agent.create", "agent.disable", "agent.enable", "agent.delete"]


def test_compare_names_a_version_that_does_not_exist(admin_api, agent):
    url = f"/api/v1/agents/{agent['id']}/versions/"
    response = admin_api.get(url + "compare/?a=1&b=7")
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"b": ["no version 7"]}
    assert admin_api.get(url + "7/").status_code == 404
    assert admin_api.get(url + "99999999999999999999999/").status_code == 404
    assert admin_api.post(url + "7/restore/").status_code == 404
    assert AgentVersion.objects.count() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "gemini"}, "kind"),
        ({"kind": "openai", "base_url": "not a url"}, "base_url"),
        ({"base_url": "http://x.example/v1"}, "base_url"),  # scripted has none
        ({"kind": "openai", "api_key_secret": "has space"}, "api_key_secret"),
        ({"kind": "openai", "api_key_secret": "NEVER_SET"}, "api_key_secret"),
        ({"options": {"timeout_seconds": -1}}, "options"),
        ({"options": {"colour": 1}}, "options"),
        ({"slug": "local"}, "slug"),  # taken
    ],
)
def test_a_bad_endpoint_is_a_400_naming_the_field(admin_api, endpoint, body, field):
    payload = {"slug": "other", "name": "Other", "kind": "scripted", **body}
    response = admin_api.post("/api/v1/model-endpoints/", payload, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"]
    assert ModelEndpoint.objects.count() == 1


def test_an_endpoint_in_use_cannot_be_deleted_one_unused_can(
    admin_api, agent, tenant, admin_user
):
    secret_set(tenant=tenant, name="SPARE_KEY", value="sk-spare-0123456789", actor=None)
    used = ModelEndpoint.objects.get(slug="local")
    response = admin_api.delete(f"/api/v1/model-endpoints/{used.id}/")
    assert response.status_code == 409
    assert "support v1" in response.json()["error"]["message"]
    spare = admin_api.post(
        "/api/v1/model-endpoints/",
        {"slug": "spare", "name": "Spare", "kind": "openai",
         "base_url": "http://127.0.0.1:8000/v1", "api_key_secret": "SPARE_KEY",
         "options": {"timeout_seconds": 30, "stream": True}},
        format="json",
    ).json()  # fmt: skip
    assert spare["api_key_secret"] == "SPARE_KEY"
    edited = admin_api.patch(
        f"/api/v1/model-endpoints/{spare['id']}/", {"name": "Spare 2"}, format="json"
    )
    assert edited.status_code == 200 and edited.json()["name"] == "Spare 2"
    replaced = admin_api.put(
        f"/api/v1/model-endpoints/{spare['id']}/",
        {"slug": "spare", "name": "Spare 3", "kind": "openai"},
        format="json",
    )
    assert replaced.status_code == 200, replaced.json()
    assert (replaced.json()["base_url"], replaced.json()["options"]) == ("", {})
    assert (
        admin_api.delete(f"/api/v1/model-endpoints/{spare['id']}/").status_code == 204
    )
    assert list(ModelEndpoint.objects.values_list("slug", flat=True)) == ["local"]
    assert AuditEvent.objects.filter(action="model_endpoint.delete").count() == 1


def test_the_crash_demos_switch_is_refused_outside_a_scripted_agent(
    admin_api, endpoint, tenant
):
    endpoint_for(tenant, kind="openai", base_url="http://127.0.0.1:9/v1", slug="real")
    crash = {"create_replacement": {"crash_after_effect": True}}
    served = {**AGENT, "endpoint": "real", "model": "gpt-4o-mini", "script": []}
    refused = admin_api.post(
        "/api/v1/agents/", {**served, "tool_settings": crash}, format="json"
    )
    assert refused.status_code == 400, refused.json()
    assert "only an agent on a scripted endpoint" in str(
        refused.json()["error"]["fields"]["tool_settings"]
    )
    assert not Agent.objects.exists() and not AgentVersion.objects.exists()
    demo = admin_api.post(
        "/api/v1/agents/", {**AGENT, "tool_settings": crash}, format="json"
    )
    assert demo.status_code == 201, demo.json()
