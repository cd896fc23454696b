"""Guardrails and hooks are agent-version settings: the API shows them, a new
version holds them, and a wrong one is a 400 naming the field (and the place
in the list) with nothing written: no agent, no version, no audit event."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.models import AuditEvent
from runs.models import Agent, AgentVersion

AGENT = {"slug": "guarded", "name": "Guarded", "endpoint": "local", "model": "m"}
GUARD = {"name": "money", "stage": "input", "rule": "money_moving"}
HOOK = {"type": "redact", "params": {"patterns": ["\\d{16}"]}}


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


def test_guardrails_and_hooks_are_kept_on_the_version(admin_api):
    made = admin_api.post(
        "/api/v1/agents/", {**AGENT, "guardrails": [GUARD], "hooks": [HOOK]},
        format="json",
    )  # fmt: skip
    assert made.status_code == 201, made.content
    url = f"/api/v1/agents/{made.json()['id']}/"
    shown = admin_api.get(url).json()["current_version"]
    assert shown["guardrails"] == [GUARD]
    assert shown["hooks"] == [HOOK]
    edited = admin_api.patch(url, {"hooks": []}, format="json")
    assert edited.status_code == 200, edited.content
    versions = AgentVersion.objects.filter(agent__slug="guarded").order_by("number")
    assert [v.hooks for v in versions] == [[HOOK], []]
    assert [v.guardrails for v in versions] == [[GUARD], [GUARD]]


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"hooks": [{"type": "shell_exec"}]}, "hooks",
         "hooks[0]: type: no hook type 'shell_exec'; known: add_context"),
        ({"hooks": [HOOK, {"type": "redact", "params": {"patterns": ["("]}}]},
         "hooks", "hooks[1]: params.patterns: '(' is not a valid regex"),
        ({"hooks": [{"type": "redact", "params": {"patterns": ["(a+)+$"]}}]},
         "hooks", "nested quantifier"),
        ({"hooks": [{"type": "add_context", "params": {"txt": "x"}}]},
         "hooks", "unknown parameter 'txt'"),
        ({"hooks": [{"type": "add_context", "event": "tool_result",
                     "params": {"text": "x"}}]},
         "hooks", "add_context hooks run on before_agent"),
        ({"hooks": [{**HOOK, "timeout_seconds": 0}]}, "hooks", "timeout_seconds"),
        ({"hooks": {"type": "redact"}}, "hooks", "Expected a list"),
        ({"guardrails": [{**GUARD, "rule": "vibes"}]}, "guardrails",
         "guardrails[0]: no rule 'vibes'; known: deny_regex"),
        ({"guardrails": [{**GUARD, "stage": "middle"}]}, "guardrails",
         "stage must be 'input' or 'output'"),
        ({"guardrails": [{"name": "m", "stage": "input", "endpoint": "nowhere",
                          "model": "x"}]},
         "guardrails", "guardrails[0].endpoint: no model endpoint 'nowhere'"),
        ({"guardrails": [{"name": "m", "stage": "input", "endpoint": "local"}]},
         "guardrails", "model is required"),
        ({"guardrails": [{**GUARD, "rule": "max_length"}]}, "guardrails",
         "params.max_chars is required"),
        ({"guardrails": [GUARD, GUARD]}, "guardrails", "a second input guardrail"),
        ({"guardrails": [{**GUARD, "refusal": " "}]}, "guardrails",
         "refusal may not be blank"),
    ],
)  # fmt: skip
def test_a_wrong_guardrail_or_hook_is_refused_naming_it_and_nothing_is_written(
    admin_api, change, field, words
):
    before = written()
    response = admin_api.post("/api/v1/agents/", {**AGENT, **change}, format="json")
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert field in fields and words in str(fields[field]), fields
    assert written() == before


def test_an_edit_with_an_unknown_hook_type_makes_no_version(admin_api):
    made = admin_api.post("/api/v1/agents/", AGENT, format="json")
    assert made.status_code == 201
    before = written()
    response = admin_api.patch(
        f"/api/v1/agents/{made.json()['id']}/",
        {"hooks": [{"type": "nope"}]},
        format="json",
    )
    assert response.status_code == 400
    assert "no hook type 'nope'" in str(response.json()["error"]["fields"]["hooks"])
    assert written() == before
