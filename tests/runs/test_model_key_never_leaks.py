"""A model endpoint's key (issue 25, item 2): planted through the secrets API, it
reaches the provider as the protocol's auth header (the official SDKs' own)
and nothing else: no table, event, span, API
response, page or log line, also when the provider's error message quotes the
key back (some gateways do), and with the redaction layer's memory of handled
values switched off, so the path itself is shown to keep it out."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from controlplane import redaction
from runs.devserver import ChatCompletionsServer, MessagesServer
from runs.devserver.base import ModelServer
from runs.models import Run
from runs.services import run_start
from tests.agents import make_agent
from tests.secrets_probe import SecretProbe, captured_logs

KEY = "sk-live-Hq83-walnut-27Pd-saffron-9xWe"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["openai", "anthropic"])
def provider(request: Any) -> Iterator[tuple[str, ModelServer]]:
    server: ModelServer = (
        ChatCompletionsServer() if request.param == "openai" else MessagesServer()
    )
    with server:
        yield request.param, server


def sent_key(kind: str, headers: dict[str, str]) -> str:
    # The Anthropic SDK sends `x-api-key`, or (newer releases) a Bearer header.
    if kind == "anthropic" and "x-api-key" in headers:
        return headers["x-api-key"]
    return headers.get("authorization", "").removeprefix("Bearer ")


@pytest.mark.parametrize("scrubber", ["on", "off"])
def test_a_model_key_reaches_the_provider_and_nothing_else(
    scrubber: str,
    monkeypatch: Any,
    provider: tuple[str, ModelServer],
    tenant: Any,
    admin_user: Any,
    api_client_for: Any,
    drive_run: Any,
) -> None:
    kind, server = provider
    if scrubber == "off":
        monkeypatch.setattr(redaction, "_KNOWN_SECRET_MIN_CHARS", 10**6)
    api = api_client_for(admin_user, tenant)
    probe = SecretProbe(KEY)
    responses: dict[str, Any] = {}
    with captured_logs() as logs:
        responses["set"] = api.put(
            "/api/v1/secrets/MODEL_KEY/", {"value": KEY}, format="json"
        )
        assert responses["set"].status_code == 201
        agent = make_agent(
            tenant, "keyed", kind=kind, model="m-1", base_url=server.base_url,
            api_key_secret="MODEL_KEY", options={"max_retries": 0},
        )  # fmt: skip
        server.reply("Order 4821 ships Thursday.")
        answered = drive_run(
            run_start(tenant=tenant, agent_slug=agent.slug, input="hi", started_by=None)
        )
        assert answered.final_answer == "Order 4821 ships Thursday."
        # A provider whose refusal quotes the key it was sent.
        server.error(401, f"Invalid API key: {KEY}", kind="authentication_error")
        refused = drive_run(
            run_start(tenant=tenant, agent_slug=agent.slug, input="hi", started_by=None)
        )
        assert (refused.status, refused.stop_reason) == (
            Run.Status.FAILED,
            "model_error",
        )
        assert "Invalid API key" in refused.stop_detail
        for run in (answered, refused):
            for name, path in {
                "run": f"/api/v1/runs/{run.id}/",
                "events": f"/api/v1/runs/{run.id}/events/",
                "spans": f"/api/v1/runs/{run.id}/spans/",
                "export": f"/api/v1/runs/{run.id}/export/",
                "otlp export": f"/api/v1/runs/{run.id}/export/?format=otlp",
            }.items():
                responses[f"{name} {run.id}"] = api.get(path)
                assert responses[f"{name} {run.id}"].status_code == 200, name
            page = Client()
            page.force_login(admin_user)
            responses[f"run page {run.id}"] = page.get(f"/runs/{run.id}/")
        for name, path in {
            "runs": "/api/v1/runs/",
            "agents": "/api/v1/agents/",
            "endpoints": "/api/v1/model-endpoints/",
            "secrets": "/api/v1/secrets/",
            "audit": "/api/v1/audit/",
        }.items():
            responses[name] = api.get(path)
            assert responses[name].status_code == 200, (name, responses[name])
    assert [sent_key(kind, r["headers"]) for r in server.requests] == [KEY, KEY]
    for name, response in responses.items():
        probe.response(name, response)
    probe.logs(logs)
    probe.database()
    probe.assert_clean()
