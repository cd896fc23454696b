"""The Agents pages in real Chromium: an admin creates an agent (the server's
refusal shown at the field), edits it into v2, compares the versions, and a new
run's page names the version it started with; restores an old version, disables,
enables and deletes an agent."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from controlplane.models import AuditEvent
from runs.demo import demo_seed_shop
from runs.models import Agent, AgentVersion
from runs.services import RunInputError, run_start
from runs.services.agents import agent_update
from tests.frontend.test_browser import SCREENSHOTS

pytestmark = [pytest.mark.browser]


def test_admin_creates_and_edits_an_agent_and_a_new_run_shows_v2(
    tenant: Any, admin_user: Any, operator_user: Any, open_page: Any
) -> None:
    demo_seed_shop(tenant=tenant)  # its scripted endpoint
    page = open_page(admin_user, "/agents/")
    expect(page.get_by_role("link", name="Agents")).to_have_attribute(
        "aria-current", "page"
    )
    expect(page.locator("#agents-body")).to_contain_text("kettlecraft-support")
    page.locator("#new-agent > summary").click()
    form = page.locator("#agent-form")
    form.get_by_label("Slug (used to start runs)").fill("helper")
    form.get_by_label("Name", exact=True).fill("Helper")
    form.get_by_label("Model endpoint").select_option("scripted")
    form.get_by_label("Model", exact=True).fill("scripted")
    form.get_by_label("Tools, one a line").fill("lookup_order\nno_such_tool")
    page.get_by_role("button", name="Create agent").click()
    # The server's refusal, at the field; nothing is created.
    expect(page.locator("#agent-tools-error")).to_contain_text("no_such_tool")
    expect(form.get_by_label("Tools, one a line")).to_have_attribute(
        "aria-invalid", "true"
    )
    assert not Agent.objects.filter(slug="helper").exists()

    form.get_by_label("Tools, one a line").fill("lookup_order")
    form.get_by_text("Script (scripted endpoints only)").click()
    form.get_by_label("Replies (JSON list)").fill('[{"text": "v1 answer"}]')
    page.get_by_role("button", name="Create agent").click()
    expect(page.locator("#agent-title")).to_have_text("Helper v1")
    expect(page.locator("#agent-facts")).to_contain_text("lookup_order")
    # Creating opened the agent's page: its form is saved by its script.
    page.wait_for_load_state()

    # An edit is saved as v2; v1 stays, restorable and comparable.
    form = page.locator("#agent-form")
    form.get_by_label("Model", exact=True).fill("scripted-2")
    page.get_by_role("button", name="Save as a new version").click()
    expect(page.locator("#agent-title")).to_have_text("Helper v2")
    rows = page.locator("#versions-table tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("v2 (current)")
    expect(rows.nth(1).get_by_role("button", name="Restore v1")).to_be_visible()
    page.get_by_role("button", name="Compare").click()
    model_row = page.locator('#compare-table tr[data-field="model"]')
    # Two version reads before it draws: on a loaded CI box more than 5 s.
    expect(model_row).to_contain_text("scripted", timeout=20_000)
    expect(model_row).to_contain_text("scripted-2")
    page.screenshot(path=str(SCREENSHOTS / "agent-versions.png"), full_page=True)
    agent = Agent.objects.get(slug="helper", tenant=tenant)
    assert list(
        AgentVersion.objects.filter(agent=agent)
        .order_by("number")
        .values_list("model", flat=True)
    ) == ["scripted", "scripted-2"]

    run = run_start(
        tenant=tenant, agent_slug="helper", input="hello", started_by=operator_user
    )
    run_page = open_page(operator_user, f"/runs/{run.id}/")
    expect(run_page.locator("#run-agent")).to_contain_text("Agent helper v2")
    expect(run_page.locator("#run-title")).to_contain_text("helper v2")


def test_admin_restores_a_version_disables_enables_and_deletes_the_agent(
    tenant: Any, admin_user: Any, operator_user: Any, open_page: Any
) -> None:
    demo_seed_shop(tenant=tenant)
    agent = Agent.objects.get(tenant=tenant, slug="kettlecraft-support")
    agent_update(
        agent=agent,
        actor=admin_user,
        config={"model": "scripted-v2", "evaluated_models": ["scripted-v2"]},
        partial=True,
    )
    page = open_page(admin_user, f"/agents/{agent.id}/")
    expect(page.locator("#agent-title")).to_contain_text("v2")
    # Each action reloads the page: a button is clicked once its script is in.
    page.wait_for_load_state()

    # Restore v1: a new v3 equal to v1 is current, and the page says so.
    page.get_by_role("button", name="Restore v1").click()
    expect(page.locator("#agent-title")).to_contain_text("v3")
    expect(page.locator("#agent-facts")).to_contain_text("Modelscripted-kettlecraft")
    expect(page.locator("#versions-table tbody tr").first).to_contain_text(
        "v3 (current)"
    )
    agent.refresh_from_db()
    assert agent.current_version is not None
    assert (agent.current_version.number, agent.current_version.model) == (
        3,
        "scripted-kettlecraft",
    )
    assert AuditEvent.objects.filter(action="agent.restore").count() == 1

    # Disabled: it starts no run until it is enabled again.
    page.wait_for_load_state()
    page.get_by_role("button", name="Disable").click()
    expect(page.locator("#agent-state")).to_have_text("⊘ disabled")
    with pytest.raises(RunInputError, match="disabled"):
        run_start(
            tenant=tenant, agent_slug=agent.slug, input="hi", started_by=operator_user
        )
    page.wait_for_load_state()
    page.get_by_role("button", name="Enable").click()
    expect(page.locator("#agent-state")).to_have_text("✓ enabled")
    kept = run_start(
        tenant=tenant, agent_slug=agent.slug, input="hi", started_by=operator_user
    )

    # Deleted after a confirmation: gone from the list, its runs keep their version.
    page.wait_for_load_state()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete").click()
    page.wait_for_url("**/agents/")
    expect(page.locator("#agents-body")).not_to_contain_text("kettlecraft-support")
    agent.refresh_from_db()
    assert agent.deleted_at is not None
    kept.refresh_from_db()
    assert kept.agent_version is not None and kept.agent_version.number == 3
    actions = AuditEvent.objects.filter(object_id=str(agent.id)).order_by("id")
    assert [e.action for e in actions][-3:] == [
        "agent.disable",
        "agent.enable",
        "agent.delete",
    ]
