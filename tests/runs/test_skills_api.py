"""Skills and tool exposure through the agents API: stored with the version,
kept by a full PUT that carries them (as the agent form's does), and bad input
refused with a 400 naming the field, nothing written."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from controlplane.models import AuditEvent
from runs.models import Agent, AgentVersion

AGENT = {"slug": "s", "name": "S", "endpoint": "local", "model": "m"}
SKILL = {"name": "refunds", "summary": "When to refund.", "body": "# Refunds\nRarely."}
FIVE_MB = "x" * (5 * 1024 * 1024)


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


def written() -> tuple[int, ...]:
    return (
        Agent.objects.count(),
        AgentVersion.objects.count(),
        AuditEvent.objects.count(),
    )


def test_skills_are_stored_with_the_version_and_a_full_put_keeps_them(admin_api):
    created = admin_api.post(
        "/api/v1/agents/",
        {**AGENT, "skills": [SKILL], "tools": ["echo"],
         "tool_settings": {"echo": {"exposure": "deferred"}}},
        format="json",
    )  # fmt: skip
    assert created.status_code == 201, created.content
    version = created.json()["current_version"]
    assert version["skills"] == [SKILL]
    assert version["tool_settings"] == {"echo": {"exposure": "deferred"}}
    agent_id = created.json()["id"]

    body = {key: version[key] for key in AgentVersion.CONFIG_FIELDS}
    body["system_prompt"] = "Be brief."
    saved = admin_api.put(f"/api/v1/agents/{agent_id}/", body, format="json")
    assert saved.status_code == 200, saved.content
    assert saved.json()["current_version"]["skills"] == [SKILL]
    assert saved.json()["current_version"]["number"] == 2
    # The audit log names a body by its digest rather than holding it.
    update = AuditEvent.objects.get(action="agent.update")
    assert "body" not in update.after["skills"][0]
    assert len(update.after["skills"][0]["body_sha256"]) == 64


def test_the_agent_form_carries_the_versions_skills(admin_api, admin_user):
    created = admin_api.post(
        "/api/v1/agents/", {**AGENT, "skills": [SKILL]}, format="json"
    )
    browser = Client()
    browser.force_login(admin_user)
    page = browser.get(f"/agents/{created.json()['id']}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'name="skills"' in text and "When to refund." in text


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (
            {"skills": [SKILL, {**SKILL, "body": "again"}]},
            "skills",
            "skills[1].name 'refunds' is taken by skills[0]",
        ),
        (
            {"skills": [{**SKILL, "summary": "two\nlines"}]},
            "skills",
            "skills[0].summary must be one line",
        ),
        ({"skills": [{"name": "x"}]}, "skills", "skills[0].body"),
        ({"skills": {"refunds": "x"}}, "skills", ""),
        (
            {"tools": ["echo"], "tool_settings": {"echo": {"exposure": "hidden"}}},
            "tool_settings",
            "exposure",
        ),
    ],
)
def test_bad_skills_or_exposure_are_a_400_naming_the_field(
    admin_api, change, field, words
):
    before = written()
    response = admin_api.post("/api/v1/agents/", {**AGENT, **change}, format="json")
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert field in fields and words in str(fields[field]), fields
    assert written() == before


def test_a_5_mb_skill_body_is_refused_naming_it_and_nothing_is_written(
    admin_api, settings
):
    created = admin_api.post(
        "/api/v1/agents/", {**AGENT, "skills": [SKILL]}, format="json"
    )
    agent_id = created.json()["id"]
    before = written()
    huge = [SKILL, {"name": "huge", "summary": "Too big.", "body": FIVE_MB}]
    # Under the default request cap the whole body is refused first (413).
    response = admin_api.patch(
        f"/api/v1/agents/{agent_id}/", {"skills": huge}, format="json"
    )
    assert response.status_code == 413, response.status_code
    # Where an operator raised the cap, the skill's own limit names the field.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 16 * 1024 * 1024
    for send in (admin_api.patch, admin_api.put):
        body = {**AGENT, "skills": huge}
        del body["slug"]
        response = send(f"/api/v1/agents/{agent_id}/", body, format="json")
        assert response.status_code == 400, response.content[:300]
        message = str(response.json()["error"]["fields"]["skills"])
        assert "skills[1].body has 5242880 bytes; at most 65536" in message
        assert FIVE_MB[:1000] not in response.content.decode()
    assert written() == before
    assert Agent.objects.get(id=agent_id).current_version.skills == [SKILL]


def test_more_direct_tools_than_the_cap_are_refused_and_deferred_ones_are_not(
    admin_api, monkeypatch
):
    monkeypatch.setattr("runs.services.agent_validation.MAX_DIRECT_TOOLS", 1)
    before = written()
    body = {**AGENT, "tools": ["echo", "lookup_order"]}
    response = admin_api.post("/api/v1/agents/", body, format="json")
    assert response.status_code == 400
    assert "2 tools are sent every turn; at most 1" in str(response.json())
    assert written() == before
    body["tool_settings"] = {"lookup_order": {"exposure": "deferred"}}
    assert admin_api.post("/api/v1/agents/", body, format="json").status_code == 201
