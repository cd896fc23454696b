""" "Add to suite…" on a run page in Chromium: a run whose replacement a person
denied is proposed as a case with its order, the decision and the graders from
what went wrong ticked; the person picks a suite and the case is added. A
viewer is not offered it."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from runs.demo import demo_seed_shop
from runs.models import Agent, EvalCase
from runs.services.decide import approval_decide
from runs.services.evals import eval_suite_create
from runs.services.lifecycle import run_start
from tests.runs.conftest import drive

pytestmark = [pytest.mark.browser]

SCREENSHOTS = Path(
    os.environ.get("UI_SCREENSHOT_DIR")
    or Path(tempfile.gettempdir()) / "cp-ui-screenshots"
)


@pytest.fixture
def denied_run(tenant: Any, operator_user: Any, transactional_db: Any) -> Any:
    demo_seed_shop(tenant=tenant)
    agent = Agent.objects.get(tenant=tenant, slug="kettlecraft-support")
    run = drive(
        run_start(
            tenant=tenant, agent_slug=agent.slug, started_by=operator_user,
            input="Order #4821 arrived with a dented spout.",
        )
    )  # fmt: skip
    approval_decide(
        request=ApprovalRequest.objects.get(run=run), decided_by=operator_user,
        approve=False, reason="ask for a photo first",
    )  # fmt: skip
    eval_suite_create(
        tenant=tenant, actor=operator_user,
        document={"slug": "kettle", "name": "Kettle support", "cases": [
            {"slug": "happy", "input": "Order #4821 is damaged",
             "graders": [{"kind": "must_call", "tool": "lookup_order"}]},
        ]},
    )  # fmt: skip
    return drive(run)


def test_a_denied_run_is_added_to_a_suite_with_what_went_wrong_ticked(
    denied_run: Any, operator_user: Any, open_page: Any
) -> None:
    page = open_page(operator_user, f"/runs/{denied_run.id}/")
    page.get_by_text("Add to suite…").click()
    setup = page.locator("#add-case-setup")
    expect(setup).to_contain_text("World: order 4821 as the run saw it.")
    expect(setup).to_contain_text(
        "Approvals decided as in this run: "
        "create_replacement: deny (ask for a photo first)."
    )
    graders = page.get_by_test_id("proposed-grader")
    denied = graders.filter(has_text="must not call create_replacement")
    expect(denied).to_have_count(1)
    expect(denied).to_contain_text(
        f"{operator_user.username} denied this call: ask for a photo first"
    )
    expect(denied.get_by_role("checkbox")).to_be_checked()
    looked_up = graders.filter(has_text="must call lookup_order")
    expect(looked_up.get_by_role("checkbox")).not_to_be_checked()
    looked_up.get_by_role("checkbox").check()
    page.get_by_label("Suite").select_option("kettle")
    page.get_by_label("Case name").fill("denied-photo")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "add-to-suite.png"))
    page.get_by_role("button", name="Add case").click()
    expect(page.locator("#add-case-done")).to_have_text(
        re.compile(r"Added case denied-photo to kettle with \d+ graders\.")
    )
    expect(page.get_by_role("link", name="Open the suite")).to_have_attribute(
        "href", "/evals/suites/kettle/"
    )
    case = EvalCase.objects.get(suite__slug="kettle", slug="denied-photo")
    kinds = {(g["kind"], g.get("tool")) for g in case.graders}
    assert ("must_not_call", "create_replacement") in kinds
    assert ("must_call", "lookup_order") in kinds
    assert case.approvals == [
        {
            "tool": "create_replacement",
            "decision": "deny",
            "reason": "ask for a photo first",
        }
    ]
    # The same name again is refused, naming the field, and adds nothing.
    page.get_by_role("button", name="Add case").click()
    expect(page.locator("#add-case-error")).to_contain_text("Not added: slug")
    assert EvalCase.objects.filter(suite__slug="kettle").count() == 2


def test_a_viewer_is_not_offered_add_to_suite(
    denied_run: Any, viewer_user: Any, open_page: Any
) -> None:
    page = open_page(viewer_user, f"/runs/{denied_run.id}/")
    expect(page.get_by_text("Compare with…")).to_be_visible()
    expect(page.get_by_text("Add to suite…")).to_have_count(0)
