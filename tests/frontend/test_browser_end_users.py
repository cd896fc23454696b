"""End users as a person sees them in real Chromium: an admin sets a per-end-user
limit on the budget page, finds it on an end user's page beside what the memory
tool kept, and deletes that memory; a viewer reads both and deletes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from budgets.models import Budget
from runs.models import MemoryFile

pytestmark = [pytest.mark.browser]

KEPT = "chose replacement for order 4821"


def test_admin_sets_a_per_end_user_limit_reads_the_memory_and_deletes_it(
    tenant: Any, admin_user: Any, viewer_user: Any, open_page: Any
) -> None:
    MemoryFile.objects.create(
        tenant=tenant, end_user="c-8812", path="/memories/orders.md",
        entries=[{"date": "2026-10-29", "text": KEPT, "key": ""}], size_chars=len(KEPT),
    )  # fmt: skip

    page = open_page(admin_user, "/budget/")
    expect(page.get_by_test_id("end-user-limits")).to_contain_text(
        "No per-end-user limit"
    )
    daily = page.locator("fieldset", has_text="Each end user, daily")
    daily.get_by_label("Runs").fill("two")
    page.get_by_role("button", name="Save limits").click()
    expect(page.locator("#budget-end_user-day-runs-error")).not_to_have_text("")
    assert not Budget.objects.filter(tenant=tenant).exists()  # refused whole
    daily.get_by_label("Runs").fill("3")
    page.get_by_role("button", name="Save limits").click()
    expect(page.locator("#budget-saved")).to_have_text("Saved.")
    expect(page.get_by_test_id("end-user-limits")).to_contain_text("Runs per day3")
    assert Budget.objects.get(tenant=tenant).end_user_limits["day"]["runs"] == 3

    page.goto("/end-users/")
    page.get_by_role("link", name="c-8812").click()
    expect(page.get_by_test_id("memory-entry")).to_have_text(f"2026-10-29 · {KEPT}")
    runs_row = page.locator("#end-user-budget-body tr", has_text="runs").first
    expect(runs_row).to_contain_text("day")
    expect(runs_row.locator("td").last).to_have_text("3")

    expect(page.locator("#end-user-runs")).to_have_attribute(
        "href", "/runs/?end_user=c-8812"
    )

    viewer = open_page(viewer_user, "/end-users/c-8812/")
    expect(viewer.get_by_test_id("memory-entry")).to_have_text(f"2026-10-29 · {KEPT}")
    expect(viewer.locator("#delete-memory")).to_have_count(0)
    expect(viewer.locator("#budget-form")).to_have_count(0)

    delete = page.get_by_role("button", name="Delete all memory")
    delete.click()  # the first click only asks
    expect(page.get_by_role("button", name="Really delete all memory")).to_be_visible()
    assert MemoryFile.objects.filter(tenant=tenant, end_user="c-8812").exists()
    page.get_by_role("button", name="Really delete all memory").click()
    expect(page.get_by_test_id("memory-files")).to_have_text(
        "No memory is kept for this end user."
    )
    assert not MemoryFile.objects.filter(tenant=tenant, end_user="c-8812").exists()
