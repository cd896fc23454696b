"""What the run page tells a person once a run is over: each span's data, the
verdict, the decisions and the budget, in real Chromium against Daphne, Redis
and a Celery worker."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from runs.demo import DEMO_SCRIPT
from runs.models import Run, ToolCall
from runs.services import run_start
from tests.agents import make_agent
from tests.conftest import wait_for
from tests.frontend.test_browser import shop, waiting_run

__all__ = ["shop"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.worker,
    pytest.mark.usefixtures("runs_settle_before_flush"),
]


def finished(run: Run) -> Run:
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, what="the run to finish")
    return Run.objects.get(id=run.id)


def rows(page: Any, name: str) -> Any:
    return page.get_by_role("tree").get_by_role("treeitem", name=re.compile(name))


def api_run(page: Any, run: Run) -> dict[str, Any]:
    body: dict[str, Any] = page.evaluate(
        "async (id) => (await fetch(`/api/v1/runs/${id}/`)).json()", str(run.id)
    )
    return body


def test_a_finished_demo_run_shows_each_spans_output_tokens_and_tool_result(
    shop: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    run = waiting_run(shop, operator_user)
    page = open_page(operator_user, f"/runs/{run.id}/")
    page.get_by_role("tree").get_by_role(
        "button", name="Approve create_replacement"
    ).click()
    expect(page.locator("#run-status")).to_contain_text("succeeded", timeout=30_000)
    run = finished(run)
    # Each step's span is named for the step it works on (the API's indexes).
    expect(rows(page, r"^step ")).to_have_count(5, timeout=20_000)
    names = [
        rows(page, r"^step ")
        .nth(i)
        .locator(".label")
        .evaluate("(e) => e.firstChild.textContent")
        for i in range(5)
    ]
    assert names == [
        "step 0", "step 1", "step 1 (resumed)", "step 2", "step 3",
    ]  # fmt: skip

    # Every model call: its output, its tokens and the model that answered.
    chats = rows(page, r"^chat ")
    expect(chats).to_have_count(len(DEMO_SCRIPT))
    for i, entry in enumerate(DEMO_SCRIPT):
        chats.nth(i).click()
        usage = entry["usage"]
        expect(page.get_by_test_id("span-tokens")).to_have_text(
            f"{usage['input_tokens']} in / {usage['output_tokens']} out"
        )
        expect(page.get_by_test_id("span-model")).to_have_text("scripted-kettlecraft")
        output = page.get_by_test_id("span-output")
        expect(output).not_to_have_text("Loading…")
        if entry.get("text") and "{{" not in entry["text"]:
            expect(output).to_contain_text(entry["text"])
        for tool_call in entry.get("tool_calls", []):
            expect(output).to_contain_text(tool_call["name"])

    # Every tool call: its result, as the call's row holds it.
    calls = list(ToolCall.objects.filter(run=run).order_by("started_at"))
    assert [c.tool_name for c in calls] == [
        "lookup_order", "create_replacement", "get_delivery_date",
    ]  # fmt: skip
    for call in calls:
        rows(page, f"^execute_tool {call.tool_name}").click()
        result = page.get_by_test_id("span-result")
        expect(result).not_to_have_text("Loading…")
        shown = json.loads(result.inner_text())
        assert shown["ok"] is True and shown["data"] == call.result["data"]

    # The root says what the evaluator found.
    rows(page, r"^invoke_agent").click()
    verdict = page.get_by_test_id("span-verdict")
    expect(verdict).to_contain_text("passed")
    expect(verdict).to_contain_text(run.evaluation["reason"])
    expect(page.get_by_test_id("run-verdict")).to_contain_text(
        f"evaluation passed: {run.evaluation['reason']}"
    )

    # Wall time is the run's active seconds as the server's budget counts them,
    # not the time the run sat waiting for the approval.
    served = api_run(page, run)["budget"]["wall_seconds"]["used"]
    wall = page.get_by_role("meter", name="Wall time")
    assert float(wall.get_attribute("aria-valuenow") or "nan") == served
    assert run.started_at and run.finished_at
    assert served < (run.finished_at - run.started_at).total_seconds()

    # No budget is set for the tenant, and its page still shows what was used.
    page.goto("/budget/")
    tokens = page.get_by_role("meter", name="Input tokens").first
    expect(tokens).to_have_attribute("aria-valuenow", str(run.input_tokens))
    expect(page.locator("#gauges")).to_contain_text(f"{run.input_tokens:,} (no cap)")


def test_decisions_show_on_the_node_and_in_the_header(
    shop: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    # Approved with edited arguments, a scope and a reason, from the span panel.
    run = waiting_run(shop, operator_user)
    page = open_page(operator_user, f"/runs/{run.id}/")
    rows(page, r"^approval create_replacement").click()
    args = page.get_by_label("Arguments (edit to change what runs)")
    before = pending_args = ApprovalRequest.objects.get(run=run).args_snapshot
    after = {**pending_args, "reason": "dented spout, photo checked"}
    args.fill("{not json")
    page.get_by_role("button", name="Approve create_replacement (panel)").click()
    expect(page.locator("#approve-args-error")).to_contain_text("Not valid JSON")
    assert ApprovalRequest.objects.get(run=run).status == "pending"  # nothing sent
    args.fill(json.dumps(after))
    page.get_by_label("Scope").select_option("run")
    page.get_by_label("Reason for approving").fill("photos show the dent")
    page.get_by_role("button", name="Approve create_replacement (panel)").click()
    # An edit is shown as a diff and sent only once confirmed.
    diff = page.get_by_test_id("args-diff")
    expect(diff).to_contain_text("− ")
    expect(diff).to_contain_text('+   "reason": "dented spout, photo checked"')
    assert ApprovalRequest.objects.get(run=run).status == "pending"
    page.get_by_role("button", name="Confirm approval").click()
    expect(page.locator("#run-status")).to_contain_text("succeeded", timeout=30_000)
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.status == "approved" and approval.args_snapshot == after
    assert approval.original_args == before and approval.scope == "run"

    node = rows(page, r"^approval create_replacement")
    expect(node).to_have_accessible_name(re.compile("approved"))
    inline = node.get_by_test_id("decision-inline")
    for text in ("approved by oscar-operator", "scope run", "photos show the dent",
                 "arguments edited by oscar-operator"):  # fmt: skip
        expect(inline).to_contain_text(text)
    node.click()
    box = page.get_by_test_id("approval-decision")
    expect(box).to_contain_text("by oscar-operator")
    expect(box).to_contain_text("photos show the dent")
    expect(box).to_contain_text("run")
    assert json.loads(page.get_by_test_id("args-before").inner_text()) == before
    assert json.loads(page.get_by_test_id("args-after").inner_text()) == after
    header = page.get_by_test_id("run-decisions")
    expect(header).to_contain_text("create_replacement approved by oscar-operator")
    expect(header).to_contain_text("photos show the dent")
    expect(header).to_contain_text("scope run")
    assert json.loads(page.get_by_test_id("run-args-before").inner_text()) == before
    assert json.loads(page.get_by_test_id("run-args-after").inner_text()) == after

    # Denied with a reason, from the node: the header says who and why, and
    # the run's outcome says why it ended as it did.
    run = waiting_run(shop, operator_user)
    page = open_page(operator_user, f"/runs/{run.id}/")
    page.get_by_role("tree").get_by_role(
        "button", name="Deny create_replacement"
    ).click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_label("Reason").fill("Wrong warehouse; ship from Leeds.")
    dialog.get_by_role("button", name="Deny").click()
    run = finished(run)
    expect(page.locator("#run-status")).to_contain_text(
        run.status.replace("_", " "), timeout=30_000
    )
    header = page.get_by_test_id("run-decisions")
    expect(header).to_contain_text("create_replacement denied by oscar-operator")
    expect(header).to_contain_text("Wrong warehouse; ship from Leeds.")
    verdict = api_run(page, run)["verdict"]
    outcome = page.get_by_test_id("run-verdict")
    expect(outcome).to_contain_text(verdict["reason"])
    if run.status != Run.Status.SUCCEEDED:
        expect(outcome).to_contain_text(
            "create_replacement was denied by oscar-operator: "
            "“Wrong warehouse; ship from Leeds.”"
        )
    node = rows(page, r"^approval create_replacement")
    expect(node.get_by_test_id("decision-inline")).to_contain_text(
        "denied by oscar-operator"
    )
    expect(node.get_by_test_id("decision-inline")).to_contain_text("Wrong warehouse")


def test_an_unverified_run_reads_as_unverified_not_as_an_error(
    tenant: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    make_agent(
        tenant, "no-evaluator", name="No evaluator", tools=["echo"],
        script=[{"text": "done here"}],
    )  # fmt: skip
    run = finished(
        run_start(tenant=tenant, agent_slug="no-evaluator", input="hi", started_by=None)
    )
    assert run.status == Run.Status.UNVERIFIED
    page = open_page(operator_user, f"/runs/{run.id}/")
    expect(page.get_by_test_id("run-verdict")).to_contain_text(
        "evaluation unverified: the agent has no evaluator"
    )
    root = rows(page, r"^invoke_agent")
    expect(root).to_have_accessible_name(re.compile(r"^invoke_agent.*, unverified,"))
    expect(root.locator(".sicon")).to_have_class(re.compile("s-unverified"))
    root.click()
    expect(page.get_by_test_id("span-verdict")).to_contain_text("unverified")
    expect(page.locator("#detail .errorbox")).to_have_count(0)
