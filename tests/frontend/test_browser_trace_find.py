"""Finding things in a trace, in real Chromium against Daphne: search with
highlights and n/N, `e` for the next error with marks on every ancestor, deep
links (a span, an approval, an OTLP-ingested span), the time axis (ticks, zoom
to a step, the minimap, waiting for a person) and a model call drawn as a
conversation with per-span and per-subtree totals."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from controlplane.services import api_token_issue
from tests.conftest import wait_for
from tests.frontend.test_browser import SCREENSHOTS
from tests.frontend.test_ingested_trace import send_nested_trace
from tests.tracing.stored_trace import store_trace
from tracing.models import Span

pytestmark = [pytest.mark.browser]

# 130 steps of 5 spans: over 1,000 events, so the page loads it lazily (roots
# and steps; a step's children on expand) and must ask the server to search.
LARGE = {"steps": 130, "tools": 3, "error_step": 117}


def row(page: Any, name: str) -> Any:
    return page.get_by_role("tree").get_by_role(
        # The status words are an sr-only span of the label: Chromium may put a
        # space before their comma.
        "treeitem",
        name=re.compile(f"^{re.escape(name)} ?,"),
    )


def opened(page: Any, path: str) -> Any:
    """A fresh navigation to `path` (a deep link is read when the page loads)."""
    page.goto(path)
    page.wait_for_selector("body[data-interactive='1']")
    return page


def test_a_lazily_loaded_trace_opened_whole_is_searched_without_the_server(
    tenant: Any, operator_user: Any, open_page: Any
) -> None:
    trace = store_trace(tenant=tenant, user=operator_user, **LARGE)
    page = opened(open_page(operator_user), f"/runs/{trace.run.id}/")
    # A page of children says which spans are leaves: a tool without children
    # offers no expander once its step is open.
    row(page, "step 0").click()
    page.keyboard.press("*")  # every step open
    total = Span.objects.filter(run=trace.run).count()
    page.wait_for_function(f"() => window.cpTrace.size >= {total}", timeout=60_000)
    leaf = row(page, "execute_tool lookup_order #0").first
    expect(leaf).not_to_have_attribute("aria-expanded", re.compile("."))
    # The one tool with a span under it: its list loads once it is shown.
    page.get_by_role("tree").focus()
    page.keyboard.press("e")
    page.wait_for_function("() => window.cpTrace.complete", timeout=30_000)
    asked: list[str] = []
    page.on(
        "request", lambda r: asked.append(r.url) if "/spans/search/" in r.url else None
    )
    search = page.get_by_role("searchbox", name=re.compile("Search spans"))
    search.fill("lookup_order #2")
    expect(page.locator("#search-status")).to_have_text("1 of 130 matches")
    search.fill("KC-2161")
    expect(page.locator("#search-status")).to_have_text("1 of 1 match")
    assert asked == []


def test_search_and_next_error_in_a_large_lazily_loaded_trace(
    tenant: Any, operator_user: Any, open_page: Any
) -> None:
    trace = store_trace(tenant=tenant, user=operator_user, **LARGE)
    page = opened(open_page(operator_user), f"/runs/{trace.run.id}/")
    # The error sits under step 117, not loaded: the marks on its ancestors
    # show it from the top.
    expect(row(page, "invoke_agent stored-trace")).to_have_accessible_name(
        re.compile(r", an error below,")
    )
    # Rows are virtualised: scroll to where step 117 is drawn (row 118).
    page.locator("#tree").evaluate("(tree) => { tree.scrollTop = 118 * 30 - 90; }")
    step = row(page, "step 117")
    expect(step).to_have_accessible_name(re.compile("an error below"))
    expect(row(page, "step 116")).not_to_have_accessible_name(re.compile("error below"))
    expect(row(page, "http POST warehouse")).to_have_count(0)

    # e: the next error, opened in place, selected, in view and in the URL.
    page.get_by_role("tree").focus()
    page.keyboard.press("e")
    failed = row(page, "http POST warehouse")
    expect(failed).to_have_attribute("aria-selected", "true")
    expect(failed).to_be_in_viewport()
    expect(page.locator("#search-status")).to_have_text(
        "Error 1 of 1: http POST warehouse"
    )
    expect(page.locator("#detail-title")).to_have_text("http POST warehouse")
    expect(page.locator("#detail .errorbox")).to_contain_text(
        "warehouse answered 503 Service Unavailable"
    )
    assert page.url.endswith(f"#span={trace.failed.span_id}")
    expect(row(page, "execute_tool lookup_order #2").nth(0)).to_have_accessible_name(
        re.compile("an error below")
    )

    # Search by an attribute's value: the server finds the one span and says
    # what matched; its step opens around it.
    search = page.get_by_role("searchbox", name=re.compile("Search spans"))
    search.fill("KC-2161")
    expect(page.locator("#search-status")).to_have_text("1 of 1 match")
    hit = page.locator(".trow.hit-current")
    expect(hit).to_contain_text("execute_tool lookup_order #1")
    expect(hit.locator(".hit-why")).to_have_text("cp.tool.order_id = KC-2161")
    expect(hit).to_have_attribute("aria-selected", "true")

    # By name: every step's third tool, highlighted; n and N move through them.
    asked: list[str] = []
    page.on(
        "request", lambda r: asked.append(r.url) if "/spans/search/" in r.url else None
    )
    search.fill("lookup_order #2")
    expect(page.locator("#search-status")).to_have_text("1 of 130 matches")
    expect(page.locator(".trow.hit-current mark")).to_have_text("lookup_order #2")
    page.get_by_role("tree").focus()
    page.keyboard.press("n")
    expect(page.locator("#search-status")).to_have_text("2 of 130 matches")
    page.keyboard.press("n")
    expect(page.locator("#search-status")).to_have_text("3 of 130 matches")
    page.keyboard.press("N")
    expect(page.locator("#search-status")).to_have_text("2 of 130 matches")
    current = page.locator(".trow.hit-current")
    expect(current).to_be_in_viewport()
    expect(current).to_contain_text("lookup_order #2")
    ids = current.get_attribute("data-span")
    assert Span.objects.get(span_id=ids).parent_span_id == trace.steps[1].span_id
    # The first answer was cut to the first hits (with the count of all), the
    # rest asked for after it: N from the first hit goes round to the last one,
    # under the last step, and n back to the first.
    page.keyboard.press("N")
    expect(page.locator("#search-status")).to_have_text("1 of 130 matches")
    page.keyboard.press("N")
    expect(page.locator("#search-status")).to_have_text("130 of 130 matches")
    last = page.locator(".trow.hit-current")
    expect(last).to_be_in_viewport()
    expect(last.locator("mark")).to_have_text("lookup_order #2")
    last_id = last.get_attribute("data-span")
    assert Span.objects.get(span_id=last_id).parent_span_id == trace.steps[-1].span_id
    page.keyboard.press("n")
    expect(page.locator("#search-status")).to_have_text("1 of 130 matches")
    by_name = [url for url in asked if "lookup_order" in url]
    assert "limit=10" in by_name[0] and "offset" not in by_name[0], by_name
    assert any("offset=10" in url and "limit=120" in url for url in by_name), by_name

    # By status: "error" finds the failed span (and nothing that only says ok).
    search.fill("error")
    expect(page.locator("#search-status")).to_have_text("1 of 1 match")
    expect(page.locator(".trow.hit-current")).to_contain_text("http POST warehouse")
    search.fill("no such thing anywhere")
    expect(page.locator("#search-status")).to_have_text(
        "No span matches “no such thing anywhere”"
    )
    expect(page.locator(".trow.hit")).to_have_count(0)
    search.fill("lookup_order #2")
    expect(page.locator("#search-status")).to_have_text("1 of 130 matches")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "trace-search.png"))


def test_a_match_passed_before_it_was_drawn_does_not_pull_the_tree_back(
    tenant: Any, operator_user: Any, open_page: Any
) -> None:
    trace = store_trace(tenant=tenant, user=operator_user, **LARGE)
    page = opened(open_page(operator_user), f"/runs/{trace.run.id}/")
    search = page.get_by_role("searchbox", name=re.compile("Search spans"))
    search.fill("lookup_order #2")
    status = page.locator("#search-status")
    expect(status).to_have_text("1 of 130 matches")
    page.get_by_role("tree").focus()
    page.keyboard.press("N")  # round to the last: every match is in now
    expect(status).to_have_text("130 of 130 matches")
    page.keyboard.press("n")
    page.keyboard.press("n")
    expect(status).to_have_text("2 of 130 matches")
    # N to the first match, then N again once the first is drawn but before
    # its own scroll (two frames after) ran, as on a busy machine: the tree
    # stays at the last match, the one the person asked for last.
    page.evaluate(
        """async () => {
          const tree = document.getElementById("tree");
          const press = () => tree.dispatchEvent(new KeyboardEvent(
            "keydown", { key: "N", shiftKey: true, bubbles: true, cancelable: true }));
          press();
          await new Promise((drawn) => requestAnimationFrame(drawn));
          press();
        }"""
    )
    expect(status).to_have_text("130 of 130 matches")
    last = page.locator(".trow.hit-current")
    expect(last).to_be_in_viewport()
    page.wait_for_timeout(500)  # what a late scroll would have moved by now
    expect(last).to_be_in_viewport()
    last_id = last.get_attribute("data-span")
    assert Span.objects.get(span_id=last_id).parent_span_id == trace.steps[-1].span_id


def test_deep_links_select_open_and_scroll_to_a_span_an_approval_and_ingested_span(
    tenant: Any, operator_user: Any, open_page: Any, daphne: Any
) -> None:
    trace = store_trace(tenant=tenant, user=operator_user, **LARGE)
    page = open_page(operator_user)
    run = f"/runs/{trace.run.id}/"
    # A span not loaded (step 117's children load on expand).
    opened(page, f"{run}#span={trace.failed.span_id}")
    failed = row(page, "http POST warehouse")
    expect(failed).to_have_attribute("aria-selected", "true")
    expect(failed).to_be_in_viewport()
    expect(page.locator("#detail-title")).to_have_text("http POST warehouse")
    # Selecting another span puts it in the address bar; that address opens it.
    row(page, "step 118").click()
    expect(page).to_have_url(re.compile(f"#span={trace.steps[118].span_id}$"))
    link = page.url
    page.goto("/runs/")
    opened(page, link)
    expect(row(page, "step 118")).to_have_attribute("aria-selected", "true")
    expect(page.locator("#detail-title")).to_have_text("step 118")

    # An approval, by its id (the inbox's link) or by its tool call.
    for anchor in (f"approval={trace.approval_request.id}", "call=call_wait"):
        page.goto("/runs/")
        opened(page, f"{run}#{anchor}")
        node = row(page, "approval create_replacement")
        expect(node).to_have_attribute("aria-selected", "true")
        expect(node).to_be_in_viewport()
        expect(page.get_by_test_id("approval-decision")).to_contain_text(
            "approved by oscar-operator"
        )
    # A link to a span of another run says so, and selects nothing.
    page.goto("/runs/")
    opened(page, f"{run}#span=00000000deadbeef")
    expect(page.locator("#run-error")).to_have_text(
        "The linked span is not in this run's trace."
    )

    # An OTLP-ingested trace: a leaf four levels down.
    secret = api_token_issue(tenant=tenant, user=operator_user).secret
    trace_id, _ = send_nested_trace(daphne.url, secret)
    leaf = wait_for(
        lambda: Span.objects.filter(
            trace_id=f"{trace_id:032x}", name="bank transfer"
        ).first(),
        what="the ingested trace",
    )
    page.goto("/runs/")
    opened(page, f"/runs/{leaf.run_id}/#span={leaf.span_id}")
    node = row(page, "bank transfer")
    expect(node).to_have_attribute("aria-selected", "true")
    expect(node).to_have_attribute("aria-level", "4")
    expect(page.locator("#detail-title")).to_have_text("bank transfer")


def test_time_axis_ticks_zoom_to_a_step_minimap_and_waiting_for_a_person(
    tenant: Any, operator_user: Any, open_page: Any
) -> None:
    trace = store_trace(tenant=tenant, user=operator_user, steps=8, tools=3)
    page = opened(open_page(operator_user), f"/runs/{trace.run.id}/")
    ticks = page.get_by_test_id("axis-ticks").locator(".tick")
    # 8 steps of 10 s, one waiting a minute: a 2m 20s run, ticks every 30 s.
    expect(ticks).to_have_text(["0 s", "30 s", "1m", "1m 30s", "2m"])
    expect(page.locator("#axis-label")).to_have_text("Whole run: 2m 20s")
    expect(page.locator("#axis-waiting")).to_have_text("Waiting for a person: 1m 0s")
    # The wait is its own segment on the step that waited and its approval.
    waited = row(page, "step 2").locator(".wait")
    expect(waited).to_have_attribute("title", "waiting for a person: 1m 0s")
    expect(row(page, "step 3").locator(".wait")).to_have_count(0)
    expect(row(page, "approval create_replacement").locator(".bar")).to_have_class(
        re.compile("b-wait")
    )
    expect(page.locator("#minimap")).to_be_hidden()  # a small trace needs none

    # Click a step's bar: the axis zooms to it, ticks relabelled from run start.
    row(page, "step 3").locator(".bar-track").click()
    expect(page.locator("#axis-label")).to_have_text(
        "Zoomed to step 3: 1m 30s – 1m 39s (9.36 s)"
    )
    expect(ticks.first).to_have_text("1m 30s")
    expect(row(page, "step 3")).to_have_attribute("aria-selected", "true")
    page.get_by_role("button", name="Whole run").click()
    expect(page.locator("#axis-label")).to_have_text("Whole run: 2m 20s")
    # z on the selected span, Shift+Z back.
    row(page, "step 5").click()
    page.keyboard.press("z")
    expect(page.locator("#axis-label")).to_contain_text("Zoomed to step 5")
    page.keyboard.press("Shift+Z")
    expect(page.locator("#axis-label")).to_have_text("Whole run: 2m 20s")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "trace-time-axis.png"))

    # A large trace has a minimap; dragging on it zooms to that window.
    large = store_trace(tenant=tenant, user=operator_user, **LARGE)
    page.goto("/runs/")
    opened(page, f"/runs/{large.run.id}/")
    minimap = page.get_by_role("img", name=re.compile("^Minimap of the whole run"))
    expect(minimap).to_be_visible()
    expect(minimap).to_have_attribute("aria-label", re.compile(", 1 failed;"))
    box = minimap.bounding_box()
    assert box
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + 10)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.75, box["y"] + 10)
    page.mouse.up()
    expect(page.locator("#axis-label")).to_have_text(re.compile(r"^Zoomed to \d"))
    page.screenshot(path=str(SCREENSHOTS / "trace-minimap.png"))


def test_a_model_call_reads_as_a_conversation_with_span_and_subtree_totals(
    tenant: Any, operator_user: Any, open_page: Any
) -> None:
    trace = store_trace(
        tenant=tenant, user=operator_user, steps=4, tools=2, error_step=3
    )
    page = opened(
        open_page(operator_user), f"/runs/{trace.run.id}/#span={trace.chat.span_id}"
    )
    expect(page.locator("#detail-title")).to_have_text("chat scripted")
    conversation = page.get_by_test_id("span-input")
    messages = conversation.get_by_role("article")
    expect(messages).to_have_count(4)
    expect(messages.nth(0)).to_have_attribute("aria-label", "System message")
    user = messages.nth(1)
    expect(user.locator(".msg-role")).to_have_text("User")
    # Real newlines, not "\n" escapes in a JSON string.
    assert user.locator(".msg-text").inner_text() == (
        "My kettle KC-1042 arrived dented.\nCan you help?"
    )
    call = messages.nth(2).get_by_test_id("tool-call")
    expect(call).to_contain_text("Tool call lookup_order · call_lookup")
    expect(call).to_contain_text('"order_id": "KC-1042"')
    result = messages.nth(3).get_by_test_id("tool-result")
    expect(result).to_contain_text("Tool result · call_lookup")
    expect(result).to_contain_text('"status": "delivered"')

    # A long answer is folded to its first lines until asked.
    output = page.get_by_test_id("span-output")
    expect(output).to_contain_text("Line 12 of the refund policy.")
    expect(output).not_to_contain_text("Line 40 of the refund policy.")
    output.get_by_role("button", name="Show all 40 lines").click()
    expect(output).to_contain_text("Line 40 of the refund policy.")
    output.get_by_role("button", name="Show less").click()
    expect(output).not_to_contain_text("Line 40 of the refund policy.")

    # Totals: this span, and everything under it.
    totals = page.get_by_test_id("span-totals")
    expect(totals.locator("tr[data-total='Tokens'] td").nth(0)).to_have_text(
        "101 in / 10 out"
    )
    expect(totals.locator("tr[data-total='Latency'] td").nth(0)).to_have_text("800 ms")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "span-conversation.png"))
    row(page, "step 2").click()
    totals = page.get_by_test_id("span-totals")
    expect(totals.locator("thead")).to_contain_text(
        "With everything under it (5 spans)"
    )
    cells = {
        name: totals.locator(f"tr[data-total='{name}'] td").nth(1)
        for name in ("Tokens", "Cost", "Latency", "Tools", "Waiting for a person")
    }
    expect(cells["Tokens"]).to_have_text("102 in / 10 out")
    expect(cells["Cost"]).to_have_text("$0.01")
    expect(cells["Latency"]).to_have_text("800 ms in 1 model call")
    expect(cells["Tools"]).to_have_text("600 ms in 2 calls")
    expect(cells["Waiting for a person"]).to_have_text("1m 0s")
    row(page, "invoke_agent stored-trace").click()
    totals = page.get_by_test_id("span-totals")
    # The root's own usage attribute is not counted again on top of its calls.
    expect(totals.locator("tr[data-total='Tokens'] td").nth(1)).to_have_text(
        "406 in / 40 out"
    )
    expect(totals.locator("tr[data-total='Cost'] td").nth(1)).to_have_text("$0.04")
    expect(totals.locator("tr[data-total='Errors'] td").nth(1)).to_have_text("1")
