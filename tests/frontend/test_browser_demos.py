"""The demo scripts page in real Chromium (Daphne, Redis, a Celery worker): an
operator clicks "Run" on a script and its run page shows the outcome; a viewer
reads the scripts with no button."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from runs.demo import demo_seed_shop
from runs.demo_scripts import DEMO_SCRIPTS
from runs.models import Run

pytestmark = [
    pytest.mark.browser,
    pytest.mark.worker,
    pytest.mark.usefixtures("runs_settle_before_flush"),
]


@pytest.fixture
def seeded(tenant: Any, transactional_db: Any) -> Any:
    demo_seed_shop(tenant=tenant)
    return tenant


def test_run_a_demo_script_from_the_page_and_see_its_outcome(
    seeded: Any, operator_user: Any, viewer_user: Any, open_page: Any
) -> None:
    page = open_page(operator_user, "/demos/")
    rows = page.locator("#demos-table tbody tr")
    expect(rows).to_have_count(len(DEMO_SCRIPTS))
    row = page.locator('tr[data-slug="schema-error"]')
    expect(row).to_contain_text('Input "#4821"')
    row.get_by_role("button", name=re.compile("Run script 7")).click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}/$"))
    run_id = page.url.rstrip("/").rsplit("/", 1)[-1]
    facts = page.locator("#run-facts")
    expect(facts).to_contain_text(
        "I found order 4821: the Copper kettle, 1.7 l, delivered.", timeout=60_000
    )
    run = Run.objects.get(id=run_id)
    assert run.agent.slug == "kettlecraft-schema"
    assert run.started_by == operator_user
    # The refused "#4821" never reached the tool: one lookup ran.
    expect(
        page.get_by_role("treeitem", name=re.compile("^execute_tool lookup_order"))
    ).to_have_count(1)

    viewer = open_page(viewer_user, "/demos/")
    expect(viewer.locator("#demos-table tbody tr")).to_have_count(len(DEMO_SCRIPTS))
    expect(viewer.locator("button.demo-run")).to_have_count(0)
    expect(
        viewer.get_by_text("Read only: operators and admins run them.")
    ).to_be_visible()
