"""Retry from the run page in real Chromium against Daphne and a Celery worker:
an operator retries a failed run with the Retry button, sees the new branch
succeed, and switches back through "Branches" to the original, which still
shows its failure; a viewer gets no Retry button (docs/ui.md "Branches")."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from runs.models import Run, SessionBranch, ToolCall
from runs.services import run_start
from runs.services.decide import approval_decide
from shop.models import Replacement
from tests.agents import make_agent
from tests.frontend.test_accessibility import axe_violations
from tests.frontend.test_browser import shop
from tests.runs.test_branches import PROVIDER_DOWN, REPLACE, SHIPPED
from tests.runs.test_settled import LOOKUPS, OVERFLOW

__all__ = ["shop"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.worker,
    pytest.mark.usefixtures("runs_settle_before_flush"),
]


def settled(run: Run, timeout: float = 60) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.status in Run.TERMINAL:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run.id} still {run.status}")


def test_retry_a_failed_run_then_switch_back_to_the_original(
    shop: Any, operator_user: Any, viewer_user: Any, open_page: Any, ui_worker: Any
) -> None:
    agent = make_agent(
        shop, "flaky", tools=["lookup_order", "create_replacement"],
        script=[REPLACE, PROVIDER_DOWN, SHIPPED], evaluator="kettlecraft_replacement",
        tool_settings={"create_replacement": {"approval": "never"}},
    )  # fmt: skip
    original = settled(
        run_start(
            tenant=shop,
            agent_slug=agent.slug,
            input="order 4821 broke",
            started_by=operator_user,
        )  # fmt: skip
    )
    assert original.status == "failed"

    viewer = open_page(viewer_user, f"/runs/{original.id}/")
    expect(viewer.locator("#run-status")).to_contain_text("failed")
    expect(viewer.locator("#retry-run")).to_have_count(0)

    page = open_page(operator_user, f"/runs/{original.id}/")
    expect(page.locator("#run-status")).to_contain_text("failed")
    expect(page.locator("#branches")).to_be_hidden()  # one run: nothing to switch
    page.get_by_role("button", name="Retry").click()
    elsewhere = re.compile(rf"/runs/(?!{original.id})[0-9a-f-]{{36}}/$")
    page.wait_for_url(elsewhere)
    retry = Run.objects.get(branch__kind=SessionBranch.Kind.RETRY)
    assert page.url.endswith(f"/runs/{retry.id}/")
    expect(page.locator("#run-status")).to_contain_text("succeeded", timeout=60_000)
    expect(page.get_by_role("button", name="Retry")).to_be_hidden()
    branches = page.get_by_test_id("branch")
    expect(branches).to_have_count(2)
    expect(branches.nth(0)).to_contain_text("Original")
    expect(branches.nth(0)).to_contain_text("failed")
    expect(branches.nth(1)).to_contain_text("Retry #1")
    expect(branches.nth(1)).to_contain_text("succeeded")
    expect(branches.nth(1)).to_have_attribute("aria-current", "page")
    assert axe_violations(page) == []
    # The tool ran once, on the original: the retry kept its result.
    assert Replacement.objects.count() == 1
    assert ToolCall.objects.filter(run=retry).count() == 0

    branches.nth(0).get_by_role("link").click()
    page.wait_for_url(f"**/runs/{original.id}/")
    expect(page.locator("#run-status")).to_contain_text("failed")
    expect(page.locator("#run-facts")).to_contain_text("upstream said 503")
    expect(page.get_by_test_id("branch").nth(0)).to_have_attribute(
        "aria-current", "page"
    )
    expect(page.get_by_role("button", name="Retry")).to_be_visible()


def test_an_overflowed_run_reads_recovering_until_its_branch_settles_then_complete(
    shop: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    """Scenario 16 on the page: the run whose model call overflowed shows its
    failure, "recovering on a new branch…" and a link to the recovery; once the
    recovery (waiting for an approval) is approved and settles, the same open
    page reads "complete" without a reload."""
    agent = make_agent(
        shop, "long", tools=["echo", "create_replacement"],
        script=[*LOOKUPS, OVERFLOW, REPLACE, SHIPPED],
    )  # fmt: skip
    original = settled(
        run_start(
            tenant=shop,
            agent_slug=agent.slug,
            input="order 4821 broke",
            started_by=operator_user,
        )  # fmt: skip
    )
    assert original.stop_reason == "context_overflow"
    recovery = Run.objects.get(branch__kind=SessionBranch.Kind.RECOVERY)

    page = open_page(operator_user, f"/runs/{original.id}/")
    expect(page.locator("#run-status")).to_contain_text("failed")
    expect(page.get_by_test_id("run-settled")).to_have_text(
        "recovering on a new branch…", timeout=30_000
    )
    expect(page.get_by_test_id("run-recovery")).to_contain_text(str(recovery.id)[:8])
    expect(page.locator("#run-facts")).to_contain_text("context longer than")
    branches = page.get_by_test_id("branch")
    expect(branches).to_have_count(2)
    expect(branches.nth(1)).to_contain_text("Recovery #1")

    deadline = time.monotonic() + 60
    while Run.objects.get(id=recovery.id).status != "waiting_approval":
        assert time.monotonic() < deadline, "the recovery never asked for approval"
        time.sleep(0.1)
    approval_decide(
        request=ApprovalRequest.objects.get(run=recovery),
        decided_by=operator_user,
        approve=True,
    )
    expect(page.get_by_test_id("run-settled")).to_have_text("complete", timeout=60_000)
    expect(page.locator("#run-status")).to_contain_text("failed")  # what happened

    page.get_by_test_id("run-recovery").click()
    page.wait_for_url(f"**/runs/{recovery.id}/")
    expect(page.get_by_test_id("run-settled")).to_have_text("complete")
    expect(page.get_by_test_id("run-recovers")).to_contain_text(str(original.id)[:8])
    expect(page.locator("#run-facts")).to_contain_text(SHIPPED["text"].split("{")[0])
