"""Agents, their versions and model endpoints in the Django admin: versions are
read-only, and what may change goes through the audited services."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from controlplane.models import AuditEvent
from runs.models import Agent, AgentVersion, ModelEndpoint
from tests.agents import make_agent


@pytest.fixture
def superuser_client(db):
    user = get_user_model().objects.create_superuser(username="root", password="pw")
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_lists_agents_versions_and_endpoints(superuser_client, tenant):
    agent = make_agent(tenant, "helper", script=[{"text": "hi"}], name="Helper")
    version = agent.current_version
    for path, shown in [
        ("agent", "Helper"),
        ("agentversion", "helper"),
        ("modelendpoint", "scripted"),
    ]:
        page = superuser_client.get(f"/admin/runs/{path}/")
        assert page.status_code == 200
        assert shown in page.content.decode()
    page = superuser_client.get(f"/admin/runs/agentversion/{version.pk}/change/")
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()  # read-only
    posted = superuser_client.post(
        f"/admin/runs/agentversion/{version.pk}/change/", {"model": "changed"}
    )
    assert posted.status_code == 403
    assert AgentVersion.objects.get(pk=version.pk).model == "scripted"
    assert superuser_client.get("/admin/runs/agent/add/").status_code == 403


def test_disabling_in_the_admin_is_audited(superuser_client, tenant):
    agent = make_agent(tenant, "helper", script=[{"text": "hi"}])
    response = superuser_client.post(
        "/admin/runs/agent/",
        {"action": "disable", "_selected_action": [str(agent.pk)]},
    )
    assert response.status_code == 302
    assert Agent.objects.get(pk=agent.pk).disabled
    assert AuditEvent.objects.filter(action="agent.disable").count() == 1


def test_an_endpoint_edit_in_the_admin_is_validated_and_audited(
    superuser_client, tenant
):
    agent = make_agent(tenant, "helper", script=[{"text": "hi"}])
    endpoint = agent.current_version.endpoint
    url = f"/admin/runs/modelendpoint/{endpoint.pk}/change/"
    form = {
        "slug": endpoint.slug, "name": "Renamed", "kind": "scripted",
        "base_url": "http://not-for-scripted.example/", "api_key_secret": "",
        "options": "{}",
    }  # fmt: skip
    refused = superuser_client.post(url, form)
    assert refused.status_code == 200  # the form again, with the error
    assert "a scripted endpoint has no URL" in refused.content.decode()
    assert ModelEndpoint.objects.get(pk=endpoint.pk).name == endpoint.name
    accepted = superuser_client.post(url, {**form, "base_url": ""})
    assert accepted.status_code == 302
    assert ModelEndpoint.objects.get(pk=endpoint.pk).name == "Renamed"
    assert AuditEvent.objects.filter(action="model_endpoint.update").count() == 1
