"""An agent version's `subagents` (agents as tools), saved through the API: an
unknown slug, an agent listing itself, or a list that closes a cycle through
the sub-agents' current versions is a 400 naming the field, nothing written;
a good list is stored and shown."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.models import AuditEvent
from runs.models import Agent, AgentVersion

pytestmark = pytest.mark.django_db

BASE = {"endpoint": "local", "model": "m"}


@pytest.fixture
def admin_api(tenant: Any, admin_user: Any, api_client_for: Any) -> Any:
    api = api_client_for(admin_user, tenant)
    made = api.post(
        "/api/v1/model-endpoints/",
        {"slug": "local", "name": "Local", "kind": "scripted"},
        format="json",
    )
    assert made.status_code == 201, made.content
    return api


def create(api: Any, slug: str, **config: Any) -> Any:
    return api.post(
        "/api/v1/agents/", {"slug": slug, "name": slug, **BASE, **config}, format="json"
    )


def written() -> tuple[int, int, int]:
    return (
        Agent.objects.count(),
        AgentVersion.objects.count(),
        AuditEvent.objects.count(),
    )


def refused(response: Any, words: str) -> None:
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert list(fields) == ["subagents"], fields
    assert words in str(fields["subagents"]), fields


def test_a_good_list_is_stored_and_shown(admin_api):
    assert create(admin_api, "researcher").status_code == 201
    made = create(
        admin_api, "lead",
        subagents=["researcher", ],
    )  # fmt: skip
    assert made.status_code == 201, made.content
    shown = made.json()["current_version"]["subagents"]
    assert shown == [{"agent": "researcher", "description": ""}]
    agent = made.json()["id"]
    edited = admin_api.patch(
        f"/api/v1/agents/{agent}/",
        {"subagents": [{"agent": "researcher", "description": "Looks things up."}]},
        format="json",
    )
    assert edited.status_code == 200, edited.content
    assert edited.json()["current_version"]["subagents"] == [
        {"agent": "researcher", "description": "Looks things up."}
    ]
    assert edited.json()["current_version"]["number"] == 2


def test_an_unknown_agent_is_refused_naming_the_field(admin_api):
    before = written()
    refused(create(admin_api, "lead", subagents=["ghost"]), "no agent 'ghost'")
    assert written() == before


def test_another_tenants_agent_is_unknown(admin_api, other_tenant):
    from tests.agents import make_agent

    make_agent(other_tenant, "theirs")
    before = written()
    refused(create(admin_api, "lead", subagents=["theirs"]), "no agent 'theirs'")
    assert written() == before


def test_an_agent_listing_itself_is_refused(admin_api):
    made = create(admin_api, "solo")
    before = written()
    response = admin_api.patch(
        f"/api/v1/agents/{made.json()['id']}/", {"subagents": ["solo"]}, format="json"
    )
    refused(response, "may not list itself")
    assert written() == before


def test_a_cycle_through_sub_agents_is_refused(admin_api):
    a = create(admin_api, "a").json()
    assert create(admin_api, "b", subagents=["a"]).status_code == 201
    assert create(admin_api, "c", subagents=["b"]).status_code == 201
    before = written()
    response = admin_api.patch(
        f"/api/v1/agents/{a['id']}/", {"subagents": ["c"]}, format="json"
    )
    refused(response, "a cycle: a -> c -> b -> a")
    assert written() == before
    assert AgentVersion.objects.get(agent_id=a["id"]).subagents == []


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("researcher", "Expected a list"),
        ([{"agent": "researcher", "extra": 1}], "unknown keys"),
        ([{"agent": "researcher", "description": "x" * 1001}], "at most 1000"),
        ([7], "must be a slug or an object"),
        (["researcher", "researcher"], "lists an agent twice"),
    ],
)
def test_a_malformed_list_is_refused(admin_api, value, words):
    assert create(admin_api, "researcher").status_code == 201
    before = written()
    response = create(admin_api, "lead", subagents=value)
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert "subagents" in fields and words in str(fields["subagents"]), fields
    assert written() == before
