"""Every page works in real Chromium under the Content-Security-Policy: nothing is
refused, the live stream connects, the trace tree draws and the tenant switcher
(once an inline handler) still switches."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from controlplane.services import membership_set, tenant_create
from runs.demo import DEMO_INPUT, demo_seed_shop
from runs.services import run_start
from tests.runs.conftest import drive

pytestmark = [pytest.mark.browser]


def test_pages_run_under_the_policy_and_the_tenant_switcher_switches(
    tenant: Any, admin_user: Any, make_member: Any, open_page: Any
) -> None:
    demo_seed_shop(tenant=tenant)
    make_member(tenant, "approver", "operator")
    run = drive(
        run_start(
            tenant=tenant,
            agent_slug="kettlecraft-support",
            input=DEMO_INPUT,
            started_by=admin_user,
        )
    )
    membership_set(
        tenant=tenant_create(slug="second", name="Second Co"),
        user=admin_user,
        role="viewer",
    )
    page = open_page(admin_user, f"/runs/{run.id}/")
    refused: list[str] = []
    page.on(
        "console",
        lambda msg: (
            refused.append(msg.text) if "Content Security Policy" in msg.text else None
        ),
    )
    page.reload()
    # The run page drew its tree from the API and follows the stream.
    expect(page.get_by_role("treeitem").first).to_be_visible()
    expect(page.locator("#conn")).to_contain_text("Live")
    for path in ("/runs/", "/approvals/"):
        page.goto(path)
        expect(page.locator("#conn")).to_contain_text("Live")
    page.goto("/budget/")
    expect(page.get_by_role("button", name="Save limits")).to_be_visible()
    page.goto("/audit/")
    expect(page.locator("main")).to_contain_text("approval")
    page.get_by_label("Tenant").select_option("second")
    page.wait_for_url("**/runs/")
    expect(page.locator(".role-badge")).to_have_text("viewer")
    assert refused == []
