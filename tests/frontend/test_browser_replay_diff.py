"""A run beside its replay in Chromium: reached from the run page's "Compare
with…", a replay under a rule added since shows the denied create_replacement
as the first divergence, the recorded call succeeded on the left."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalPolicyRule, ApprovalRequest
from runs.demo import demo_seed_shop
from runs.models import Agent, Run
from runs.services.decide import approval_decide
from runs.services.lifecycle import run_start
from tests.runs.conftest import drive

pytestmark = [pytest.mark.browser]


@pytest.fixture
def approved_run(tenant: Any, operator_user: Any, transactional_db: Any) -> Run:
    demo_seed_shop(tenant=tenant)
    agent = Agent.objects.get(tenant=tenant, slug="kettlecraft-support")
    run = drive(
        run_start(
            tenant=tenant, agent_slug=agent.slug, started_by=operator_user,
            input="order 4821 arrived damaged",
        )
    )  # fmt: skip
    approval_decide(
        request=ApprovalRequest.objects.get(run=run), decided_by=operator_user,
        approve=True,
    )  # fmt: skip
    return drive(run)


def test_the_replay_under_a_new_rule_shows_the_denied_call_as_the_divergence(
    approved_run: Run, admin_user: Any, operator_user: Any, open_page: Any
) -> None:
    ApprovalPolicyRule.objects.create(
        tenant=approved_run.tenant, name="no replacements",
        tool="create_replacement", action="deny",
    )  # fmt: skip
    page = open_page(operator_user, f"/runs/{approved_run.id}/")
    page.get_by_text("Compare with…").click()
    page.get_by_role("link", name="Compare with its replay").click()
    page.wait_for_url(f"**/runs/{approved_run.id}/replay/")
    expect(
        page.get_by_role("heading", name="The run beside its replay")
    ).to_be_visible()
    marker = page.get_by_test_id("first-divergence")
    expect(marker).to_have_count(1)
    pair = page.get_by_test_id("diff-pair").filter(has=marker)
    expect(pair).to_have_attribute("data-kind", "changed")
    expect(pair.get_by_test_id("tool-left")).to_have_text("create_replacement")
    expect(pair.locator(".side-left .status")).to_have_text("succeeded")
    expect(pair.locator(".side-right .status")).to_have_text("denied")
    expect(page.get_by_test_id("diff-totals")).to_contain_text("Replay")


def test_an_unchanged_replay_says_it_did_what_the_run_did(
    approved_run: Run, operator_user: Any, open_page: Any
) -> None:
    page = open_page(operator_user, f"/runs/{approved_run.id}/replay/")
    expect(page.get_by_test_id("diff-summary")).to_contain_text(
        "4 same, 0 changed, 0 inserted, 0 skipped. The replay did what the run did."
    )
