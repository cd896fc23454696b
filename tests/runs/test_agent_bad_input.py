"""Bad input an operator can send that the first checks let through: a scripted
reply the model cannot read, a key in an endpoint's URL, a cap beyond what a span
can hold. Each is a 400 naming the field, with nothing written (before: the agent
was saved and its runs failed with a bare `adapter_error: TypeError`, the URL's
password was shown to every member, and a max_cost of 1e400 made span writes
fail)."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.models import AuditEvent
from runs.models import Agent, AgentVersion, ModelEndpoint, Run

AGENT = {"slug": "s", "name": "S", "endpoint": "local", "model": "m"}


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
        ModelEndpoint.objects.count(),
        Run.objects.count(),
        AuditEvent.objects.count(),
    )


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"script": [{"tool_calls": "x"}]}, "script", "script[0].tool_calls"),
        ({"script": [{"text": 5}]}, "script", "script[0].text must be a string"),
        (
            {"script": [{"text": "a"}, {"tool_calls": [{"arguments": {}}]}]},
            "script",
            "script[1].tool_calls[0].name",
        ),
        ({"script": [{"usage": "x"}]}, "script", "script[0].usage"),
        (
            {"script": [{"text": "a", "on_error": {"c": {"text": ["b"]}}}]},
            "script",
            "script[0].on_error[c].text",
        ),
        ({"default_limits": {"max_cost": "1e400"}}, "default_limits", "at most"),
        ({"default_limits": {"max_steps": 10**30}}, "default_limits", "at most"),
    ],
)
def test_a_malformed_definition_is_refused_naming_the_field(
    admin_api, change, field, words
):
    before = written()
    response = admin_api.post("/api/v1/agents/", {**AGENT, **change}, format="json")
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert field in fields and words in str(fields[field]), fields
    assert written() == before


def test_an_edit_to_a_malformed_script_makes_no_version(admin_api):
    created = admin_api.post(
        "/api/v1/agents/", {**AGENT, "script": [{"text": "hi"}]}, format="json"
    )
    assert created.status_code == 201
    before = written()
    response = admin_api.patch(
        f"/api/v1/agents/{created.json()['id']}/",
        {"script": [{"tool_calls": [{"name": "x", "arguments": 3}]}]},
        format="json",
    )
    assert response.status_code == 400
    assert "script[0].tool_calls[0].arguments" in str(response.json())
    assert written() == before


def test_a_key_in_the_endpoint_url_is_refused_and_shown_nowhere(admin_api):
    before = written()
    response = admin_api.post(
        "/api/v1/model-endpoints/",
        {"slug": "o", "name": "O", "kind": "openai",
         "base_url": "https://user:sk-live-123@llm.example/v1"},
        format="json",
    )  # fmt: skip
    assert response.status_code == 400
    assert "api_key_secret" in str(response.json()["error"]["fields"]["base_url"])
    assert "sk-live-123" not in response.content.decode()
    assert written() == before
    endpoint = ModelEndpoint.objects.get(slug="local")
    response = admin_api.patch(
        f"/api/v1/model-endpoints/{endpoint.id}/",
        {"kind": "openai", "base_url": "http://k:v@127.0.0.1:9/v1"},
        format="json",
    )
    assert response.status_code == 400
    endpoint.refresh_from_db()
    assert (endpoint.kind, endpoint.base_url) == ("scripted", "")


def test_a_run_asking_for_an_unholdable_cap_is_refused(
    admin_api, tenant, operator_user, api_client_for
):
    assert (
        admin_api.post(
            "/api/v1/agents/", {**AGENT, "script": [{"text": "hi"}]}, format="json"
        ).status_code
        == 201
    )
    operator = api_client_for(operator_user, tenant)
    before = written()
    response = operator.post(
        "/api/v1/runs/",
        {"agent": "s", "input": "x", "limits": {"max_cost": "1e400"}},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert "max_cost" in str(response.json()["error"]["fields"]["limits"])
    assert written() == before
