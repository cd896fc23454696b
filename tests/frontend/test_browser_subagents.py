"""Sub-agents as a person sees them in real Chromium (a real worker runs the
tree): the parent's run page shows the child run's spans inside the trace,
under the call that started it, and the child's answer there; the inbox card of
an approval inside a child says which parent run it serves."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from runs.demo import demo_seed_shop
from runs.models import Run
from runs.services import run_cancel, run_start
from runs.services.decide import approval_decide
from tests.agents import make_agent
from tests.conftest import wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.worker,
    pytest.mark.usefixtures("runs_settle_before_flush"),
]

ANSWER = "Order 4821 shipped on 2 May; the carrier is DHL."


def settled(run: Run, timeout: float = 60) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.is_terminal:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run.id} still {run.status}")


def test_the_childs_answer_shows_in_the_tree_under_the_calling_span(
    tenant: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    make_agent(tenant, "researcher", script=[{"text": ANSWER}])
    make_agent(
        tenant, "lead", subagents=["researcher"],
        script=[{"tool_calls": [{"id": "call_r", "name": "agent__researcher",
                                 "arguments": {"task": "When did 4821 ship?"}}]},
                {"text": "It shipped on 2 May."}],
    )  # fmt: skip
    parent = settled(run_start(tenant=tenant, agent_slug="lead", input="Where?",
                               started_by=operator_user))  # fmt: skip
    assert parent.final_answer == "It shipped on 2 May.", parent.stop_detail

    page = open_page(operator_user, f"/runs/{parent.id}/")
    call = page.locator(".trow", has_text="execute_tool agent__researcher")
    expect(call).to_have_count(1)
    child_root = page.locator(".trow", has_text="invoke_agent researcher")
    expect(child_root).to_have_count(1)
    level = int(call.get_attribute("aria-level") or 0)
    expect(child_root).to_have_attribute("aria-level", str(level + 1))
    # Right below the calling span's row, one level deeper: its child.
    call_index = int(call.get_attribute("data-index") or -1)
    assert int(child_root.get_attribute("data-index") or -1) == call_index + 1
    child_root.click()
    expect(page.locator("#detail")).to_contain_text(ANSWER)
    # The child's own spans are there too: the parent's two model calls and
    # the child's one.
    expect(page.locator(".trow", has_text="chat scripted")).to_have_count(3)
    # The child's own page names the run it serves.
    child = Run.objects.get(parent_run=parent)
    page.goto(f"/runs/{child.id}/")
    expect(page.get_by_test_id("run-parent")).to_have_text(
        f"run {str(parent.id)[:8]} (call call_r)"
    )


def test_an_approval_inside_a_child_names_the_parent_it_serves(
    tenant: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    make_agent(
        tenant, "writer", tools=["echo"],
        tool_settings={"echo": {"approval": "always"}},
        script=[{"tool_calls": [{"id": "e1", "name": "echo",
                                 "arguments": {"text": "hi"}}]},
                {"text": "said hi"}],
    )  # fmt: skip
    make_agent(
        tenant, "lead", subagents=["writer"],
        script=[{"tool_calls": [{"id": "call_w", "name": "agent__writer",
                                 "arguments": {"task": "Say hi."}}]},
                {"text": "done"}],
    )  # fmt: skip
    parent = run_start(tenant=tenant, agent_slug="lead", input="Go",
                       started_by=operator_user)  # fmt: skip
    child = wait_for(
        lambda: Run.objects.filter(
            parent_run=parent, status="waiting_approval"
        ).first(),
        timeout=60,
        what="the child waits for an approval",
    )
    try:
        page = open_page(operator_user, "/approvals/")
        card = page.locator("li[data-approval]", has_text=f"run {str(child.id)[:8]}")
        expect(card).to_have_count(1)
        expect(card).to_contain_text(f"sub-agent of run {str(parent.id)[:8]}")
        expect(card.locator("a.parent-run")).to_have_attribute(
            "href", f"/runs/{parent.id}/"
        )
    finally:
        run_cancel(run=parent, actor=operator_user)


def test_a_running_childs_spans_show_live_under_the_calling_span(
    tenant: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    make_agent(
        tenant, "writer", tools=["echo"],
        tool_settings={"echo": {"approval": "always"}},
        script=[{"tool_calls": [{"id": "e1", "name": "echo",
                                 "arguments": {"text": "first line"}}]},
                {"tool_calls": [{"id": "e2", "name": "echo",
                                 "arguments": {"text": "second line"}}]},
                {"text": "Wrote both lines."}],
    )  # fmt: skip
    make_agent(
        tenant, "lead", subagents=["writer"],
        script=[{"tool_calls": [{"id": "call_w", "name": "agent__writer",
                                 "arguments": {"task": "Write two lines."}}]},
                {"text": "The writer is done."}],
    )  # fmt: skip
    parent = run_start(tenant=tenant, agent_slug="lead", input="Go",
                       started_by=operator_user)  # fmt: skip

    def pending(call_id: str) -> ApprovalRequest | None:
        return ApprovalRequest.objects.filter(
            run__parent_run=parent, status="pending", tool_call__call_id=call_id
        ).first()

    first = wait_for(lambda: pending("e1"), timeout=60, what="the child asks for e1")
    page = open_page(operator_user, f"/runs/{parent.id}/")
    call = page.locator(".trow", has_text="execute_tool agent__writer")
    expect(call).to_have_count(1)
    child_root = page.locator(".trow", has_text="invoke_agent writer")
    expect(child_root).to_have_attribute(
        "aria-level", str(int(call.get_attribute("aria-level") or 0) + 1)
    )
    approvals = page.locator(".trow", has_text="approval echo")
    expect(approvals).to_have_count(1)
    expect(page.locator(".trow", has_text="execute_tool echo")).to_have_count(0)

    # The child goes on (its first call approved) and stops at its second
    # call: the parent's page, not reloaded, shows what the child did since.
    approval_decide(request=first, decided_by=operator_user, approve=True)
    second = wait_for(lambda: pending("e2"), timeout=60, what="the child asks for e2")
    executed = page.locator(".trow", has_text="execute_tool echo")
    expect(executed).to_have_count(1)
    expect(approvals).to_have_count(2)
    expect(page.locator(".trow", has_text="chat scripted")).to_have_count(3)
    # Below the calling span: the child's spans are deeper than its root.
    child_level = int(child_root.get_attribute("aria-level") or 0)
    assert int(executed.get_attribute("aria-level") or 0) > child_level
    executed.click()
    expect(page.locator("#detail")).to_contain_text("first line")
    assert page.evaluate("window.cpSubagents.following") == [str(second.run_id)]
    # The child's pending call is decided from the parent's page.
    approvals.nth(1).click()
    detail = page.locator("#detail")
    expect(detail).to_contain_text("Waiting for approval")
    expect(detail.get_by_label("Arguments (edit to change what runs)")).to_have_value(
        re.compile("second line")
    )
    assert Run.objects.get(id=second.run_id).status == "waiting_approval"
    parent.refresh_from_db()
    assert not parent.is_terminal

    # Approved, the child answers and the parent ends: the answer is there.
    approvals.nth(1).get_by_role("button", name="Approve echo", exact=True).click()
    assert settled(parent).final_answer == "The writer is done.", parent.stop_detail
    expect(executed).to_have_count(2)
    # Read live and read again at the call's end: each span once.
    expect(page.locator(".trow", has_text="chat scripted")).to_have_count(5)
    # The child's stream closed with its call; the page's own stays live.
    page.wait_for_function("() => window.cpSubagents.following.length === 0")
    expect(page.locator("#conn")).to_have_text("● Live")
    child_root.click()
    expect(page.locator("#detail")).to_contain_text("Wrote both lines.")
    page.reload()
    expect(page.locator(".trow", has_text="execute_tool echo")).to_have_count(2)
    expect(page.locator(".trow", has_text="approval echo")).to_have_count(2)
    expect(page.locator(".trow", has_text="chat scripted")).to_have_count(5)
    # The child's decisions, listed in the parent's header, say whose they were.
    decisions = page.get_by_test_id("run-decisions").locator("li")
    expect(decisions).to_have_count(2)
    for line in decisions.all():
        expect(line).to_contain_text("approved by oscar-operator")
        expect(line).to_contain_text(f"in sub-agent run {str(second.run_id)[:8]}")
    expect(decisions.first.get_by_role("link")).to_have_attribute(
        "href", f"/runs/{second.run_id}/"
    )


def test_a_grandchilds_spans_show_live_under_its_calling_span(
    tenant: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    make_agent(
        tenant, "writer", tools=["echo"],
        tool_settings={"echo": {"approval": "always"}},
        script=[{"tool_calls": [{"id": "e1", "name": "echo",
                                 "arguments": {"text": "first line"}}]},
                {"tool_calls": [{"id": "e2", "name": "echo",
                                 "arguments": {"text": "second line"}}]},
                {"text": "Wrote both lines."}],
    )  # fmt: skip
    make_agent(
        tenant, "editor", subagents=["writer"],
        script=[{"tool_calls": [{"id": "call_w", "name": "agent__writer",
                                 "arguments": {"task": "Write two lines."}}]},
                {"text": "Edited."}],
    )  # fmt: skip
    make_agent(
        tenant, "lead", subagents=["editor"],
        script=[{"tool_calls": [{"id": "call_e", "name": "agent__editor",
                                 "arguments": {"task": "Get two lines written."}}]},
                {"text": "All done."}],
    )  # fmt: skip
    parent = run_start(tenant=tenant, agent_slug="lead", input="Go",
                       started_by=operator_user)  # fmt: skip

    def pending(call_id: str) -> ApprovalRequest | None:
        return ApprovalRequest.objects.filter(
            run__parent_run__parent_run=parent, status="pending",
            tool_call__call_id=call_id,
        ).first()  # fmt: skip

    first = wait_for(lambda: pending("e1"), timeout=60, what="the grandchild asks")
    page = open_page(operator_user, f"/runs/{parent.id}/")
    grandchild_call = page.locator(".trow", has_text="execute_tool agent__writer")
    expect(grandchild_call).to_have_count(1)
    grandchild_root = page.locator(".trow", has_text="invoke_agent writer")
    expect(grandchild_root).to_have_attribute(
        "aria-level", str(int(grandchild_call.get_attribute("aria-level") or 0) + 1)
    )
    executed = page.locator(".trow", has_text="execute_tool echo")
    expect(executed).to_have_count(0)

    approval_decide(request=first, decided_by=operator_user, approve=True)
    second = wait_for(lambda: pending("e2"), timeout=60, what="the second ask")
    expect(executed).to_have_count(1)
    expect(page.locator(".trow", has_text="approval echo")).to_have_count(2)
    executed.click()
    expect(page.locator("#detail")).to_contain_text("first line")
    assert Run.objects.get(id=second.run_id).status == "waiting_approval"

    approval_decide(request=second, decided_by=operator_user, approve=True)
    assert settled(parent).final_answer == "All done.", parent.stop_detail
    expect(executed).to_have_count(2)
    grandchild_root.click()
    expect(page.locator("#detail")).to_contain_text("Wrote both lines.")
    expect(page.locator(".trow", has_text="chat scripted")).to_have_count(7)


def test_the_agent_form_edits_sub_agents_and_names_a_bad_one(
    tenant: Any, admin_user: Any, open_page: Any
) -> None:
    make_agent(tenant, "researcher", script=[{"text": ANSWER}])
    lead = make_agent(tenant, "lead", subagents=["researcher"])
    page = open_page(admin_user, f"/agents/{lead.id}/")
    form = page.locator("#agent-form")
    form.get_by_text("Sub-agents", exact=True).click()
    field = form.get_by_label("Sub-agents (JSON list)")
    expect(field).to_have_value('[\n  {\n    "agent": "researcher",\n'
                                '    "description": ""\n  }\n]')  # fmt: skip
    field.fill('["researcher", "lead"]')
    page.get_by_role("button", name="Save as a new version").click()
    expect(page.locator("#agent-subagents-error")).to_contain_text(
        "may not list itself"
    )
    assert lead.versions.count() == 1
    # An edit of another field keeps the list.
    field.fill('[{"agent": "researcher", "description": "Looks orders up."}]')
    form.get_by_label("Model", exact=True).fill("scripted-2")
    page.get_by_role("button", name="Save as a new version").click()
    expect(page.locator("#agent-title")).to_contain_text("v2")
    version = lead.versions.get(number=2)
    assert version.subagents == [
        {"agent": "researcher", "description": "Looks orders up."}
    ]


def test_a_childs_denial_in_the_parents_outcome_names_the_child(
    tenant: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    demo_seed_shop(tenant=tenant)
    make_agent(
        tenant, "fixer", tools=["create_replacement"],
        script=[{"tool_calls": [{"id": "r1", "name": "create_replacement",
                                 "arguments": {"order_id": "4821",
                                               "reason": "arrived damaged"}}]},
                {"text": "The replacement was refused."}],
    )  # fmt: skip
    make_agent(
        tenant, "lead", subagents=["fixer"],
        script=[{"tool_calls": [{"id": "call_f", "name": "agent__fixer",
                                 "arguments": {"task": "Replace order 4821."}}]},
                {"text": "A replacement is on its way."}],
    )  # fmt: skip
    parent = run_start(tenant=tenant, agent_slug="lead", input="Order 4821 is damaged",
                       started_by=operator_user)  # fmt: skip
    asked = wait_for(
        lambda: ApprovalRequest.objects.filter(
            run__parent_run=parent, status="pending"
        ).first(),
        timeout=60,
        what="the child asks to replace",
    )
    approval_decide(
        request=asked, decided_by=operator_user, approve=False, reason="Wrong order."
    )
    parent = settled(parent)
    assert parent.status != Run.Status.SUCCEEDED, parent.status

    page = open_page(operator_user, f"/runs/{parent.id}/")
    expect(page.get_by_test_id("run-verdict")).to_contain_text(
        f"create_replacement in sub-agent run {str(asked.run_id)[:8]} was denied"
        " by oscar-operator: “Wrong order.”"
    )
