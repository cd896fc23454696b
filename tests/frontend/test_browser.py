"""The UI in real Chromium against a real Daphne, Redis and Celery worker."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from runs.demo import DEMO_INPUT, demo_seed_shop
from runs.models import Run
from runs.services import run_cancel, run_start
from tests.conftest import wait_for
from tests.frontend.conftest import DaphneServer
from tracing.models import Span

pytestmark = [
    pytest.mark.browser,
    pytest.mark.worker,
    pytest.mark.usefixtures("runs_settle_before_flush"),
]

# Set UI_SCREENSHOT_DIR=docs/screenshots to refresh the README's pictures; a test
# run never rewrites tracked files by default.
SCREENSHOTS = Path(
    os.environ.get("UI_SCREENSHOT_DIR")
    or Path(tempfile.gettempdir()) / "cp-ui-screenshots"
)


@pytest.fixture
def shop(tenant: Any, transactional_db: Any) -> Any:
    demo_seed_shop(tenant=tenant)
    return tenant


def waiting_run(tenant: Any, user: Any) -> Run:
    """Start the demo run and let the worker take it to the approval gate."""
    run = run_start(
        tenant=tenant,
        agent_slug="kettlecraft-support",
        input=DEMO_INPUT,
        started_by=user,
    )
    wait_for(
        lambda: Run.objects.get(id=run.id).status == Run.Status.WAITING_APPROVAL,
        what="the run to wait for approval",
    )
    return Run.objects.get(id=run.id)


def pending_of(run: Run) -> ApprovalRequest:
    return ApprovalRequest.objects.get(run=run, status="pending")


def tree_state(page: Any) -> dict[str, Any]:
    """What the page holds: span ids and whether any list repeats one."""
    return page.evaluate(
        """() => {
        const m = window.cpTrace;
        const lists = [m.roots, ...[...m.nodes.values()].map((n) => n.children || [])];
        const dupes = lists.some((l) => new Set(l).size !== l.length);
        const placed = lists.flat();
        return {ids: [...m.nodes.keys()], placed: placed.length, dupes};
        }"""
    )


def test_operator_starts_the_demo_run_watches_it_live_approves_and_it_succeeds(
    shop: Any, operator_user: Any, admin_user: Any, open_page: Any, ui_worker: Any
) -> None:
    page = open_page(operator_user, "/runs/")
    expect(page.locator("#runs-body")).to_contain_text("No runs yet")
    page.get_by_label("Agent to run").select_option("kettlecraft-support")
    page.get_by_label("Input").fill(DEMO_INPUT)
    page.get_by_role("button", name="Start run").click()
    row = page.locator("#runs-body tr[data-run]").first
    expect(row).to_contain_text("kettlecraft-support")
    # The list follows the run live: no reload.
    # Its "Waiting on" cell names who it waits on: an approval.
    expect(row.locator("a.waiting")).to_have_text("‖ approval", timeout=30_000)
    expect(row).to_contain_text("waiting for approval")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "runs-list.png"))
    run_id = row.get_attribute("data-run")

    row.locator("a.run-link").click()
    page.wait_for_url(f"**/runs/{run_id}/")
    tree = page.get_by_role("tree")
    expect(tree.get_by_role("treeitem").first).to_contain_text("invoke_agent")
    approve = tree.get_by_role("button", name="Approve create_replacement")
    expect(approve).to_be_visible()
    node = tree.locator(".trow.pending")
    expect(node).to_contain_text("4821")  # the arguments are on the node
    expect(node.locator(".left")).to_contain_text("left")  # and the time left

    # A second page (an admin) open on the same run.
    other = open_page(admin_user, f"/runs/{run_id}/")
    expect(
        other.get_by_role("button", name="Approve create_replacement")
    ).to_be_visible()
    node.click()
    expect(page.locator("#detail")).to_contain_text("Waiting for approval")
    page.screenshot(path=str(SCREENSHOTS / "run-waiting-for-approval.png"))

    approve.click()
    # Every open page shows the decision at once, and the run goes on live.
    expect(
        other.get_by_role("button", name="Approve create_replacement")
    ).to_have_count(0)
    expect(page.locator("#run-status")).to_contain_text("succeeded", timeout=30_000)
    expect(other.locator("#run-status")).to_contain_text("succeeded", timeout=30_000)
    run = Run.objects.get(id=run_id)
    assert run.status == Run.Status.SUCCEEDED
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.status == "approved"
    assert approval.decided_by == operator_user
    # The tree holds every stored span exactly once.
    wait_for(
        lambda: len(tree_state(page)["ids"]) == Span.objects.filter(run=run).count(),
        what="every span in the tree",
    )
    state = tree_state(page)
    assert not state["dupes"]
    assert sorted(state["ids"]) == sorted(
        Span.objects.filter(run=run).values_list("span_id", flat=True)
    )
    tree.get_by_role("treeitem").first.click()
    page.keyboard.press("End")
    expect(page.locator("#detail h2")).not_to_have_text("Span")
    expect(page.locator("#detail pre.payload").first).not_to_have_text("Loading…")
    page.screenshot(path=str(SCREENSHOTS / "run-succeeded.png"))


def test_deny_asks_for_a_reason_and_a_stale_page_shows_why_its_decision_failed(
    shop: Any, operator_user: Any, admin_user: Any, open_page: Any, ui_worker: Any
) -> None:
    run = waiting_run(shop, operator_user)
    page = open_page(operator_user, f"/runs/{run.id}/")
    stale = open_page(admin_user, f"/runs/{run.id}/")
    deny = page.get_by_role("tree").get_by_role(
        "button", name="Deny create_replacement"
    )
    stale_approve = stale.get_by_role("tree").get_by_role(
        "button", name="Approve create_replacement"
    )
    expect(stale_approve).to_be_visible()
    # The stale page stops listening (once it has started to, after its trace
    # and a second read of the run), so its button outlives the decision.
    stale.wait_for_function("() => window.cpStream")
    stale.evaluate("() => window.cpStreams.forEach((s) => s.stop())")

    deny.click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Deny").click()
    expect(dialog.get_by_role("alert")).to_contain_text("Say why")
    assert pending_of(run).status == "pending"  # nothing was sent
    dialog.get_by_label("Reason").fill("Wrong warehouse; ship from Leeds instead.")
    dialog.get_by_role("button", name="Deny").click()
    expect(dialog).to_be_hidden()
    expect(page.get_by_role("button", name="Deny create_replacement")).to_have_count(0)
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.status == "denied"
    assert approval.reason == "Wrong warehouse; ship from Leeds instead."

    stale_approve.click()
    expect(stale.locator("#run-error")).to_contain_text("Already decided: denied")
    expect(stale_approve).to_have_count(0)  # the node was refreshed
    assert ApprovalRequest.objects.get(run=run).status == "denied"


def test_viewer_sees_no_decision_or_edit_controls_and_a_forged_decision_is_refused(
    shop: Any, operator_user: Any, viewer_user: Any, open_page: Any, ui_worker: Any
) -> None:
    run = waiting_run(shop, operator_user)
    page = open_page(viewer_user, f"/runs/{run.id}/")
    tree = page.get_by_role("tree")
    expect(tree.locator(".trow.pending")).to_be_visible()
    expect(page.get_by_role("button", name=re.compile("Approve|Deny"))).to_have_count(0)
    expect(page.get_by_role("button", name="Cancel run")).to_have_count(0)
    approval = pending_of(run)
    status = page.evaluate(
        """async (id) => {
        const token = document.cookie.match(/csrftoken=([^;]+)/)[1];
        const r = await fetch(`/api/v1/approvals/${id}/decide/`, {method: "POST",
          headers: {"Content-Type": "application/json", "X-CSRFToken": token},
          body: JSON.stringify({decision: "approve"})});
        return r.status; }""",
        str(approval.id),
    )
    assert status == 403
    assert pending_of(run).decisions.count() == 0
    page.goto("/runs/")
    expect(page.get_by_role("button", name="Start run")).to_have_count(0)
    page.goto("/approvals/")
    expect(page.locator("#inbox li")).to_have_count(1)
    expect(page.get_by_role("button", name=re.compile("Approve|Deny"))).to_have_count(0)
    page.goto("/budget/")
    expect(page.get_by_role("button", name="Save limits")).to_have_count(0)
    assert page.goto("/audit/").status == 403


def test_inbox_lists_pending_oldest_first_live_and_approves_from_the_keyboard(
    shop: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    first = waiting_run(shop, operator_user)
    page = open_page(operator_user, "/approvals/")
    items = page.locator("#inbox li")
    expect(items).to_have_count(1)
    second = waiting_run(shop, operator_user)
    expect(items).to_have_count(2)  # arrived live
    expect(items.nth(0)).to_contain_text(str(first.id)[:8])
    expect(items.nth(1)).to_contain_text(str(second.id)[:8])
    expect(items.nth(0).get_by_role("link")).to_have_attribute(
        "href", re.compile(rf"/runs/{first.id}/#call=")
    )
    page.screenshot(path=str(SCREENSHOTS / "approvals-inbox.png"))
    items.nth(0).focus()
    page.keyboard.press("j")
    expect(items.nth(1)).to_be_focused()
    page.keyboard.press("a")
    # Sent when the undo window (APPROVAL_UNDO_SECONDS) ends.
    expect(items).to_have_count(1, timeout=20_000)
    assert pending_of(first).status == "pending"
    assert ApprovalRequest.objects.get(run=second).status == "approved"
    page.keyboard.press("d")
    page.get_by_label("Reason").fill("not today")
    page.keyboard.press("Enter")
    expect(page.locator("#inbox-empty")).to_be_visible(timeout=20_000)
    assert ApprovalRequest.objects.get(run=first).status == "denied"


def test_lost_socket_shows_reconnecting_and_after_reconnect_holds_every_span_once(
    shop: Any, operator_user: Any, open_page: Any, ui_worker: Any, tmp_path: Path
) -> None:
    from runs.services.decide import approval_decide

    server = DaphneServer(tmp_path).start()
    try:
        run = waiting_run(shop, operator_user)
        page = open_page(operator_user, f"/runs/{run.id}/", server=server)
        expect(page.locator("#conn")).to_contain_text("Live")
        expect(page.get_by_role("tree").locator(".trow.pending")).to_be_visible()
        before = len(tree_state(page)["ids"])
        server.stop()  # the connection is lost mid-run
        expect(page.locator("#conn")).to_contain_text(
            re.compile("Reconnecting|Polling")
        )
        approval_decide(request=pending_of(run), decided_by=operator_user, approve=True)
        wait_for(
            lambda: Run.objects.get(id=run.id).status == Run.Status.SUCCEEDED,
            what="the run to finish while the page is offline",
        )
        assert page.locator("#run-status").inner_text().find("succeeded") < 0
        server = DaphneServer(tmp_path, port=server.port).start()
        expect(page.locator("#conn")).to_contain_text("Live", timeout=30_000)
        expect(page.locator("#run-status")).to_contain_text("succeeded")
        stored = sorted(Span.objects.filter(run=run).values_list("span_id", flat=True))
        wait_for(lambda: len(tree_state(page)["ids"]) == len(stored), what="all spans")
        state = tree_state(page)
        assert len(stored) > before
        assert sorted(state["ids"]) == stored
        assert not state["dupes"]
        assert state["placed"] == len(stored)
    finally:
        server.stop()


def test_admin_edits_the_budget_with_server_validation_and_finds_it_in_the_audit_log(
    tenant: Any, admin_user: Any, open_page: Any
) -> None:
    from budgets.models import Budget
    from controlplane.models import AuditEvent

    page = open_page(admin_user, "/budget/")
    expect(page.get_by_role("meter", name="Runs").first).to_be_visible()
    runs_per_day = page.locator("fieldset", has_text="Per day").get_by_label("Runs")
    runs_per_day.fill("1.5")
    page.get_by_role("button", name="Save limits").click()
    error = page.locator("#budget-day-runs-error")
    expect(error).to_contain_text("integer")  # the server's message, at the field
    expect(runs_per_day).to_have_attribute("aria-invalid", "true")
    # Refused whole: no limit stored, no audit entry.
    assert not Budget.objects.filter(
        tenant=tenant, period_limits__day__has_key="runs"
    ).exists()
    assert not AuditEvent.objects.filter(tenant=tenant, action="budget.update").exists()
    runs_per_day.fill("40")
    page.locator("fieldset", has_text="Per day").get_by_label("Cost").fill("12.50")
    page.get_by_role("button", name="Save limits").click()
    expect(page.locator("#budget-saved")).to_have_text("Saved.")
    expect(error).to_have_text("")
    budget = Budget.objects.get(tenant=tenant)
    assert budget.period_limits["day"]["runs"] == 40
    expect(page.get_by_role("meter", name="Runs").first).to_have_attribute(
        "aria-valuetext", re.compile("of 40")
    )
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(SCREENSHOTS / "budget.png"))

    page.goto("/audit/")
    page.get_by_label("Action").fill("budget.update")
    page.get_by_role("button", name="Search").click()
    rows = page.locator("#audit-body tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(admin_user.username)
    page.get_by_label("Text").fill("no-such-thing")
    expect(rows.first).to_contain_text("No audit entries match")


def test_start_form_shows_the_servers_messages_and_the_list_filters(
    shop: Any, operator_user: Any, open_page: Any
) -> None:
    page = open_page(operator_user, "/runs/")
    page.get_by_role("button", name="Start run").click()
    expect(page.locator("#start-input-error")).to_contain_text("Say what")
    assert not Run.objects.exists()
    # A value the form does not offer: the server's answer lands at the field.
    page.evaluate(
        """() => { const s = document.getElementById('start-agent');
        s.append(new Option('ghost', 'ghost')); s.value = 'ghost'; }"""
    )
    page.get_by_label("Input").fill("hello")
    page.get_by_role("button", name="Start run").click()
    expect(page.locator("#start-agent-error")).to_contain_text("ghost")
    expect(page.get_by_label("Agent to run")).to_have_attribute("aria-invalid", "true")
    assert not Run.objects.exists()
    page.get_by_label("Agent to run").select_option("kettlecraft-support")
    page.get_by_role("button", name="Start run").click()
    rows = page.locator("#runs-body tr[data-run]")
    expect(rows).to_have_count(1)
    expect(page.locator("#start-agent-error")).to_have_text("")
    page.locator("#filters").get_by_label("Search").fill("no such words")
    expect(rows).to_have_count(0)
    page.locator("#filters").get_by_label("Search").fill("hello")
    expect(rows).to_have_count(1)
    page.locator("#filters").get_by_label("Status").select_option("succeeded")
    expect(rows).to_have_count(0)


def test_operator_cancels_a_waiting_run_from_its_page(
    shop: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    run = waiting_run(shop, operator_user)
    page = open_page(operator_user, f"/runs/{run.id}/")
    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator("#run-status")).to_contain_text("cancelled")
    expect(page.get_by_role("button", name="Cancel run")).to_be_hidden()
    expect(page.get_by_role("button", name="Approve create_replacement")).to_have_count(
        0
    )
    assert Run.objects.get(id=run.id).status == Run.Status.CANCELLED


def test_inbox_shows_a_budget_extension_and_approving_it_resumes_the_run(
    shop: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    from budgets.models import Budget, BudgetGrant

    Budget.objects.create(
        tenant=shop,
        period_limits={"day": {"output_tokens": 1}},
        on_exhausted="ask",
        extend_by={"output_tokens": 2048},
    )
    run = waiting_run(shop, operator_user)  # refused at its first model call
    assert pending_of(run).kind == "budget_extension"
    page = open_page(operator_user, "/approvals/")
    item = page.locator("#inbox li")
    expect(item).to_have_count(1)
    expect(item).to_have_attribute("data-kind", "budget_extension")
    expect(item.locator("code.tool")).to_have_text(
        "extend tenant_output_tokens_per_day by 2048"
    )
    expect(item.locator("pre.args")).to_contain_text("deny: the run ends")
    item.get_by_role(
        "button", name="Approve extend tenant_output_tokens_per_day by 2048"
    ).click()
    # The run resumes at the refused call and goes on to the demo's tool gate.
    expect(item).to_have_count(1)
    expect(item.locator("code.tool")).to_have_text("create_replacement", timeout=30_000)
    assert BudgetGrant.objects.get(run_id=run.id).amount == 2048
    assert ApprovalRequest.objects.get(run=run, kind="budget_extension").status == (
        "approved"
    )


def test_a_run_that_ends_while_its_page_loads_shows_its_end_in_the_header(
    shop: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    """The header is read beside the trace: a run that ends after the header's
    read and before the trace's is shown ended (its end came with the trace,
    not as a stream event). Held here: the trace's reads until the run ended."""
    run = waiting_run(shop, operator_user)
    page = open_page(operator_user, "/runs/")
    held: list[Any] = []
    released = False

    def hold(route: Any) -> None:
        if released:
            route.continue_()
        else:
            held.append(route)

    page.route(f"**/api/v1/runs/{run.id}/events/**", hold)
    page.goto(f"/runs/{run.id}/", wait_until="commit")
    expect(page.locator("#run-status")).to_contain_text("waiting")
    assert held, "the trace was not read through the events endpoint"
    run_cancel(run=run, actor=operator_user)
    released = True
    for route in held:
        route.continue_()
    expect(page.locator("#run-status")).to_contain_text("cancelled")
    expect(page.get_by_test_id("run-settled")).to_have_text("complete")
