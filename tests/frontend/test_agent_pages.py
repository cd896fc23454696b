"""The Agents pages and the run page's pinned version: what a person reads, and
the controls only admins get."""

from __future__ import annotations

import re
from typing import Any

from django.test import Client

from runs.demo import demo_seed_shop
from runs.models import Agent
from runs.services import run_start
from runs.services.agents import agent_set_disabled, agent_update


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _text(response: Any) -> str:
    """The page's text as a person reads it (tags dropped, spaces collapsed)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode()))


def test_the_agents_page_lists_agents_and_endpoints_and_admins_get_the_forms(
    tenant: Any, admin_user: Any, viewer_user: Any
) -> None:
    demo_seed_shop(tenant=tenant)
    agent = Agent.objects.get(tenant=tenant, slug="kettlecraft-support")
    agent_set_disabled(agent=agent, actor=None, disabled=True)
    page = _client(admin_user).get("/agents/")
    assert page.status_code == 200
    text = _text(page)
    assert (
        "Kettlecraft support kettlecraft-support v1 scripted scripted-kettlecraft"
        in (text)
    )
    assert "⊘ disabled" in text
    assert "Scripted model (demo) scripted scripted" in text
    assert b'id="agent-form"' in page.content and b'id="endpoint-form"' in page.content
    assert "Create agent" in text
    viewer = _client(viewer_user).get("/agents/")
    assert viewer.status_code == 200
    assert "kettlecraft-support" in _text(viewer)
    assert b'id="agent-form"' not in viewer.content
    assert b'id="endpoint-form"' not in viewer.content
    assert "Read only: admins create and edit agents." in _text(viewer)


def test_the_agent_page_shows_its_configuration_and_versions(
    tenant: Any, admin_user: Any, viewer_user: Any
) -> None:
    demo_seed_shop(tenant=tenant)
    agent = Agent.objects.get(tenant=tenant, slug="kettlecraft-support")
    agent_update(
        agent=agent,
        actor=admin_user,
        config={"model": "scripted-v2", "evaluated_models": ["scripted-v2"]},
        partial=True,
    )
    page = _client(admin_user).get(f"/agents/{agent.id}/")
    assert page.status_code == 200
    text = _text(page)
    assert "Kettlecraft support v2" in text
    assert "Model scripted-v2" in text
    assert "Tools lookup_order, get_delivery_date, create_replacement, refund" in text
    assert "v2 (current)" in text and "by alice-admin" in text
    assert "Restore v1" in text
    assert "Edit (saved as v3)" in text and "Save as a new version" in text
    assert 'value="scripted-v2"' in page.content.decode()  # the form holds v2
    viewer = _client(viewer_user).get(f"/agents/{agent.id}/")
    assert "Restore v1" not in _text(viewer)
    assert b'id="agent-form"' not in viewer.content
    assert b'id="agent-disable"' not in viewer.content
    assert b'id="compare-form"' in viewer.content  # everyone may compare


def test_another_tenants_agent_page_is_a_404(
    tenant: Any, other_tenant: Any, make_member: Any
) -> None:
    demo_seed_shop(tenant=tenant)
    agent = Agent.objects.get(tenant=tenant, slug="kettlecraft-support")
    stranger = make_member(other_tenant, "stranger", "admin")
    assert _client(stranger).get(f"/agents/{agent.id}/").status_code == 404
    assert "kettlecraft-support" not in _text(_client(stranger).get("/agents/"))


def test_the_run_page_names_the_version_the_run_started_with(
    tenant: Any, operator_user: Any
) -> None:
    demo_seed_shop(tenant=tenant)
    agent = Agent.objects.get(tenant=tenant, slug="kettlecraft-support")
    first = run_start(
        tenant=tenant, agent_slug=agent.slug, input="hi", started_by=operator_user
    )
    agent_update(agent=agent, actor=None, config={"model": "m2"}, partial=True)
    second = run_start(
        tenant=tenant, agent_slug=agent.slug, input="hi", started_by=operator_user
    )
    client = _client(operator_user)
    assert "Agent kettlecraft-support v2 (the version this run started with)" in (
        _text(client.get(f"/runs/{second.id}/"))
    )
    assert (
        "Agent kettlecraft-support v1 (the version this run started with; the agent "
        "is now at v2)"
    ) in _text(client.get(f"/runs/{first.id}/"))
