"""Deciding with context on any screen, in real Chromium against Daphne, Redis
and a Celery worker: the inbox's cards, groups, bulk decisions and undo window,
the decided tab; the run page on a phone with its sticky decision bar; and the
errors a person can act on (not found, session expired, decided elsewhere)."""

from __future__ import annotations

import re
from importlib import import_module
from typing import Any

import pytest
from django.conf import settings
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from runs.demo import DEMO_INPUT
from runs.models import Run
from runs.services.decide import approval_decide
from tests.conftest import wait_for
from tests.frontend.test_browser import SCREENSHOTS, pending_of, shop, waiting_run

__all__ = ["shop"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.worker,
    pytest.mark.usefixtures("runs_settle_before_flush"),
]

MODEL_SAID = "The kettle is damaged; I'll ship a replacement."


def statuses(*runs: Run) -> list[str]:
    return [ApprovalRequest.objects.get(run=run).status for run in runs]


def test_inbox_cards_groups_undo_bulk_and_the_decided_tab(
    shop: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    runs = [waiting_run(shop, operator_user) for _ in range(3)]
    page = open_page(operator_user, "/approvals/")
    cards = page.locator("#inbox li.inbox-item")
    expect(cards).to_have_count(3)
    first = cards.nth(0)
    # The context to decide: what the run was asked, what the model said, the rule.
    expect(first.locator(".run-input")).to_have_text(DEMO_INPUT)
    expect(first.locator(".model-message")).to_have_text(MODEL_SAID)
    expect(first.locator(".rule")).to_contain_text("Rule: ")
    expect(first.locator(".agent-name")).to_have_text("kettlecraft-support")

    page.get_by_label("Group by").select_option("agent")
    expect(
        page.get_by_role("heading", name="Agent kettlecraft-support · 3")
    ).to_be_visible()
    assert "group=agent" in page.url
    page.get_by_label("Group by").select_option("tool")
    expect(
        page.get_by_role("heading", name="Tool create_replacement · 3")
    ).to_be_visible()
    page.screenshot(path=str(SCREENSHOTS / "approvals-inbox-cards.png"))

    # A one-key decision waits with Undo; undone, nothing is decided.
    undo_ms = page.evaluate("() => window.cpInbox.undoMs")
    cards.nth(0).focus()
    page.keyboard.press("a")
    expect(cards.nth(0).get_by_role("status")).to_contain_text("Approving in")
    assert statuses(*runs) == ["pending"] * 3
    page.keyboard.press("u")
    expect(page.locator("#inbox-error")).to_contain_text(
        "Undone: nothing was decided on create_replacement; it is still waiting."
    )
    page.wait_for_timeout(undo_ms + 500)  # past the window: still nothing sent
    assert page.evaluate("() => window.cpInbox.scheduled.size") == 0
    assert statuses(*runs) == ["pending"] * 3
    assert all(not pending_of(r).decisions.exists() for r in runs)
    expect(cards).to_have_count(3)

    # Not undone: sent when the window ends.
    page.keyboard.press("a")
    expect(cards).to_have_count(2, timeout=undo_ms + 15_000)
    assert sorted(statuses(*runs)) == ["approved", "pending", "pending"]

    # Bulk: a confirmation first; a refused or cancelled one decides nothing.
    page.get_by_role("button", name="Select all").click()
    expect(page.locator("#bulk-count")).to_have_text("2 selected")
    page.get_by_role("button", name="Deny selected…").click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_role("heading")).to_have_text("Deny 2 requests?")
    expect(dialog.get_by_role("listitem")).to_have_text("create_replacement × 2")
    dialog.get_by_role("button", name="Deny 2").click()
    expect(dialog.get_by_role("alert")).to_contain_text("Say why")
    dialog.get_by_role("button", name="Cancel").click()
    expect(page.locator("#inbox-error")).to_have_text("Nothing was decided.")
    assert sorted(statuses(*runs)) == ["approved", "pending", "pending"]
    page.get_by_role("button", name="Approve selected…").click()
    expect(dialog.get_by_role("heading")).to_have_text("Approve 2 requests?")
    dialog.get_by_role("button", name="Approve 2").click()
    expect(page.locator("#inbox-error")).to_have_text("Approved 2 of 2.")
    expect(page.locator("#inbox-empty")).to_be_visible()
    assert statuses(*runs) == ["approved"] * 3

    # Who decided what, and why.
    page.get_by_role("tab", name="Decided").click()
    decided = page.locator("#inbox li.inbox-item")
    expect(decided).to_have_count(3)
    for i in range(3):
        expect(decided.nth(i).locator(".decided-summary")).to_contain_text(
            "approved by oscar-operator"
        )
    assert "tab=decided" in page.url
    page.screenshot(path=str(SCREENSHOTS / "approvals-decided.png"))


def test_decided_tab_shows_the_reason_and_the_edit(
    shop: Any, operator_user: Any, admin_user: Any, open_page: Any, ui_worker: Any
) -> None:
    run = waiting_run(shop, operator_user)
    approval = pending_of(run)
    edited = {**approval.args_snapshot, "reason": "spout dented, photo on file"}
    approval_decide(
        request=approval, decided_by=admin_user, approve=True,
        reason="checked the photo", scope="run", args=edited,
    )  # fmt: skip
    page = open_page(operator_user, "/approvals/?tab=decided")
    card = page.locator("#inbox li.inbox-item")
    expect(card).to_have_count(1)
    summary = card.locator(".decided-summary")
    expect(summary).to_contain_text("approved by alice-admin")
    expect(summary).to_contain_text("reason “checked the photo”")
    expect(summary).to_contain_text("arguments edited by alice-admin")
    expect(card.locator("pre.diff .add")).to_contain_text("spout dented, photo on file")


def test_the_run_page_on_a_phone_with_a_sticky_decision_bar(
    shop: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    run = waiting_run(shop, operator_user)
    page = open_page(operator_user, f"/runs/{run.id}/")
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    # Laid out for good: the header is read again once the trace is in, then
    # the stream starts.
    page.wait_for_function("() => window.cpStream")
    bar = page.get_by_role("region", name="Pending decision")
    expect(bar).to_contain_text("create_replacement waits for you")
    box = bar.bounding_box()
    assert box is not None and box["y"] + box["height"] <= 844 and box["y"] > 600
    # Nothing wider than the screen; the facts read as words, not a letter a line.
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    facts = page.eval_on_selector_all(
        "#run-facts dd",
        "(dds) => dds.map((dd) => [dd.textContent, dd.getBoundingClientRect().width])",
    )
    assert facts and all(width > 100 for _, width in facts), facts
    page.screenshot(path=str(SCREENSHOTS / "run-phone.png"))
    # The bar stays on screen while scrolling.
    page.mouse.wheel(0, 1500)
    expect(bar).to_be_in_viewport()
    bar.get_by_role("button", name="Approve create_replacement (bar)").click()
    expect(page.locator("#run-status")).to_contain_text("succeeded", timeout=30_000)
    expect(bar).to_be_hidden()
    assert ApprovalRequest.objects.get(run=run).status == "approved"


def test_approve_for_the_whole_run_from_the_panel(
    shop: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    run = waiting_run(shop, operator_user)
    page = open_page(operator_user, f"/runs/{run.id}/")
    page.get_by_role("tree").get_by_role(
        "treeitem", name=re.compile(r"^approval create_replacement")
    ).click()
    page.get_by_role(
        "button", name="Approve for the whole run: create_replacement"
    ).click()
    expect(page.locator("#run-error")).to_have_text(
        "Approved for the whole run create_replacement."
    )
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.status == "approved" and approval.scope == "run"
    assert approval.original_args is None


def test_a_wrong_run_url_gets_the_products_not_found_page(
    shop: Any, operator_user: Any, open_page: Any
) -> None:
    page = open_page(operator_user, "/runs/")
    for path in ("/runs/00000000-0000-4000-8000-000000000000/", "/runs/not-a-run/"):
        response = page.goto(path)
        assert response is not None and response.status == 404
        expect(page.get_by_role("heading", level=1)).to_have_text("∅ Run not found")
        expect(page.get_by_test_id("not-found-message")).to_contain_text(
            "in Kettlecraft. The link may be mistyped, or the run belongs to "
            "another tenant."
        )
        expect(page.get_by_role("navigation", name="Main")).to_be_visible()
    page.screenshot(path=str(SCREENSHOTS / "not-found.png"))
    page.get_by_role("link", name="← Back to the runs list").click()
    page.wait_for_url("**/runs/")
    expect(page.get_by_role("heading", level=1)).to_contain_text("Runs")
    page.goto("/agents/not-an-agent/")
    expect(page.get_by_role("heading", level=1)).to_have_text("∅ Agent not found")


def test_an_expired_session_on_approve_logs_in_again_and_returns_to_the_decision(
    shop: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    run = waiting_run(shop, operator_user)
    page = open_page(operator_user, f"/runs/{run.id}/")
    approve = page.get_by_role("tree").get_by_role(
        "button", name="Approve create_replacement"
    )
    expect(approve).to_be_visible()
    # The session ends on the server (expired, or logged out elsewhere).
    key = next(c["value"] for c in page.context.cookies() if c["name"] == "sessionid")
    import_module(settings.SESSION_ENGINE).SessionStore(session_key=key).delete()
    approve.click()
    error = page.locator("#run-error")
    expect(error).to_contain_text(
        "Your session has expired, so nothing was decided on create_replacement. "
        "Log in again to decide: you will come back to this decision."
    )
    approval = pending_of(run)
    assert approval.status == "pending" and not approval.decisions.exists()
    error.get_by_role("link", name="Log in again").click()
    page.get_by_label("Username").fill(operator_user.username)
    page.get_by_label("Password").fill("pw-" + operator_user.username)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(rf"/runs/{run.id}/#call=call_replace$"))
    # Back at the same decision: the call's node selected, its form open.
    panel = page.locator("#detail")
    expect(panel.get_by_role("heading", name="Waiting for approval")).to_be_visible()
    panel.get_by_role("button", name="Approve create_replacement (panel)").click()
    expect(page.locator("#run-status")).to_contain_text("succeeded", timeout=30_000)
    assert ApprovalRequest.objects.get(run=run).decided_by == operator_user


def test_a_decision_taken_elsewhere_says_by_whom_and_changes_nothing(
    shop: Any, operator_user: Any, admin_user: Any, open_page: Any, ui_worker: Any
) -> None:
    run = waiting_run(shop, operator_user)
    page = open_page(operator_user, "/approvals/")
    cards = page.locator("#inbox li.inbox-item")
    expect(cards).to_have_count(1)
    page.evaluate("() => window.cpStreams.forEach((s) => s.stop())")  # stale page
    undo_ms = page.evaluate("() => window.cpInbox.undoMs")
    cards.nth(0).focus()
    page.keyboard.press("a")  # held for the undo window
    approval_decide(
        request=pending_of(run), decided_by=admin_user, approve=False,
        reason="customer asked for a refund instead",
    )  # fmt: skip
    expect(page.locator("#inbox-error")).to_contain_text(
        "Already decided: denied by alice-admin at ", timeout=undo_ms + 15_000
    )
    expect(page.locator("#inbox-error")).to_contain_text(
        ": “customer asked for a refund instead”. Your decision was not recorded."
    )
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.status == "denied" and approval.decided_by == admin_user
    assert [d.decision for d in approval.decisions.all()] == ["deny"]
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, what="the run to end")
