"""The run diff page in Chromium: reached from a run's "Compare with…", it shows
the two demo runs' steps aligned, the changed step's arguments with the change
marked, and the first divergence marked and scrolled into view."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from runs.demo import demo_seed_shop
from runs.models import Agent
from tests.run_diff_data import demo_replies, seed_recorded_run

pytestmark = [pytest.mark.browser]

SCREENSHOTS = Path(
    os.environ.get("UI_SCREENSHOT_DIR")
    or Path(tempfile.gettempdir()) / "cp-ui-screenshots"
)


@pytest.fixture
def demo_runs(
    tenant: Any, operator_user: Any, transactional_db: Any
) -> tuple[Any, Any]:
    demo_seed_shop(tenant=tenant)
    agent = Agent.objects.get(tenant=tenant, slug="kettlecraft-support")
    good = seed_recorded_run(agent, demo_replies(), started_by=operator_user)
    # The run that went wrong: looked up order 4812 and shipped nothing.
    bad = seed_recorded_run(
        agent, demo_replies(order_id="4812", replace=False), started_by=operator_user
    )
    return good, bad


def test_compare_with_opens_the_diff_showing_the_changed_arguments_and_divergence(
    demo_runs: tuple[Any, Any], operator_user: Any, open_page: Any
) -> None:
    good, bad = demo_runs
    page = open_page(operator_user, f"/runs/{good.id}/")
    page.get_by_text("Compare with…").click()
    recent = page.get_by_label(re.compile("A recent run of kettlecraft-support"))
    expect(recent.locator("option", has_text=str(bad.id)[:8])).to_have_count(1)
    recent.select_option(str(bad.id))
    page.get_by_role("button", name="Compare").click()
    page.wait_for_url(f"**/runs/{good.id}/diff/{bad.id}/")

    pairs = page.get_by_test_id("diff-pair")
    expect(pairs).to_have_count(4)
    expect(pairs.nth(1)).to_have_attribute("data-kind", "skipped")
    changed = pairs.nth(0)
    expect(changed).to_have_attribute("data-kind", "changed")
    expect(changed.get_by_test_id("tool-left")).to_have_text("lookup_order")
    expect(changed.get_by_test_id("args-left").locator("mark")).to_have_text(
        'order_id: "4821"'
    )
    expect(changed.get_by_test_id("args-right").locator("mark")).to_have_text(
        'order_id: "4812"'
    )
    expect(changed.get_by_test_id("arg-diff")).to_have_text('order_id "4821" → "4812"')
    marker = page.get_by_test_id("first-divergence")
    expect(marker).to_have_count(1)
    expect(marker).to_have_text("First divergence")
    expect(changed.get_by_test_id("first-divergence")).to_be_visible()
    expect(page.get_by_test_id("first-divergence-link")).to_contain_text(
        "left step 0 / right step 0: lookup_order arguments differ (order_id)"
    )
    expect(pairs.nth(3).get_by_test_id("answer-right")).to_have_text(
        "I'm sorry about the dented spout; it arrives on 2026-03-02."
    )
    totals = page.get_by_test_id("diff-totals")
    expect(totals.locator("tr[data-total=Steps] td")).to_have_text(["4", "3", "−1"])
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "run-diff.png"))


def test_a_bad_run_id_in_compare_with_says_so_and_stays(
    demo_runs: tuple[Any, Any], operator_user: Any, open_page: Any
) -> None:
    good, _ = demo_runs
    page = open_page(operator_user, f"/runs/{good.id}/")
    page.get_by_text("Compare with…").click()
    page.get_by_label("or a run id").fill("nope")
    page.get_by_role("button", name="Compare").click()
    expect(page.locator("#compare-error")).to_have_text("That is not a run id.")
    expect(page).to_have_url(re.compile(rf"/runs/{good.id}/$"))


def test_the_diff_of_another_tenants_run_is_a_not_found_page(
    demo_runs: tuple[Any, Any], operator_user: Any, open_page: Any,
    other_tenant: Any,
) -> None:  # fmt: skip
    good, _ = demo_runs
    demo_seed_shop(tenant=other_tenant)
    theirs = seed_recorded_run(
        Agent.objects.get(tenant=other_tenant, slug="kettlecraft-support"),
        demo_replies(),
    )
    page = open_page(operator_user, f"/runs/{good.id}/")
    response = page.goto(f"/runs/{good.id}/diff/{theirs.id}/")
    assert response is not None and response.status == 404
    expect(page.get_by_text("(the right run of the comparison)")).to_be_visible()
