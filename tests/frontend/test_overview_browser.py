"""The overview dashboard and the budget page in real Chromium against Daphne:
a seeded history (tests/overview_seed.py) shows as the figures, chart data and
lists a person reads, and a click on a figure or a chart bucket opens the runs
list filtered to what it counted."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from playwright.sync_api import expect

from runs.models import Step, ToolCall
from tests.frontend.test_browser import SCREENSHOTS
from tests.overview_seed import seed_history

pytestmark = pytest.mark.browser

# The buckets the page charts (its 24 hours end when it loaded: same hours).
BUCKETS_OF_THE_LAST_DAY = """async () => {
  const to = new Date();
  const from = new Date(to.getTime() - 864e5);
  const query = new URLSearchParams({from: from.toISOString(), to: to.toISOString()});
  return (await (await fetch(`/api/v1/overview/?${query}`)).json()).buckets;
}"""


def _query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}


def _utc(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_overview_shows_the_tenants_figures_and_clicks_through(
    tenant: Any, other_tenant: Any, operator_user: Any, make_member: Any,
    open_page: Any,
) -> None:  # fmt: skip
    seeded = seed_history(tenant, operator_user, with_budget=True)
    seed_history(other_tenant, make_member(other_tenant, "olga-other", "operator"))
    page = open_page(operator_user, "/overview/")
    expect(page.get_by_role("link", name="Overview")).to_have_attribute(
        "aria-current", "page"
    )
    expect(page.get_by_test_id("tile-runs")).to_have_text("9runs")
    expect(page.get_by_test_id("tile-failed")).to_have_text("3failed")
    expect(page.get_by_test_id("tile-p50")).to_have_text("40.7 sp50 duration")
    expect(page.get_by_test_id("tile-p95")).to_have_text("1m 37sp95 duration")
    expect(page.get_by_test_id("tile-waiting")).to_have_text("1approvals waiting")
    expect(page.get_by_test_id("tile-decision")).to_have_text(
        "3m 0smedian time to decision"
    )
    expect(page.get_by_test_id("agents-by-cost").get_by_role("listitem")).to_have_text(
        ["beta: $1.00 (3 runs)", "alpha: $0.35 (6 runs)"]
    )
    expect(
        page.get_by_test_id("agents-by-failures").get_by_role("listitem")
    ).to_have_text(["beta: 2 failed of 3", "alpha: 1 failed of 6"])
    expect(
        page.get_by_test_id("tools-by-failures").get_by_role("listitem")
    ).to_have_text(
        ["lookup_order: 2 failed of 3 calls", "send_refund: 1 failed of 1 calls"]
    )
    expect(page.get_by_test_id("tools-by-cost").get_by_role("listitem")).to_have_text(
        ["send_refund: $0.75 (1 calls)"]
    )
    expect(page.get_by_test_id("forecast-day-cost")).to_contain_text(
        "$1.50 used, $0.20 reserved of $5.00."
    )

    # The runs chart's data, as its table reads: the seeded hours' counts.
    runs_chart = page.locator("#chart-runs")
    runs_chart.get_by_text("Data").click()
    table = runs_chart.locator("table")
    header = table.locator("thead th").all_inner_texts()
    assert header[0] == "Time (UTC)"
    start = seeded["start"]
    cells = {}
    for hour in range(3):
        stamp = (start + dt.timedelta(hours=hour)).strftime("%Y-%m-%d %H:%M")
        row = table.locator("tbody tr", has=page.locator("th", has_text=stamp))
        values = row.locator("td").all_inner_texts()
        cells[hour] = dict(zip(header[1:], values, strict=True))
    assert cells[0]["succeeded"] == "3" and cells[0]["failed"] == "1"
    assert cells[1]["succeeded"] == "1" and cells[1]["failed"] == "2"
    assert cells[2]["running"] == "1" and cells[2]["waiting for approval"] == "1"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "overview.png"), full_page=True)

    # A click on a chart bucket: the runs list of that hour.
    buckets = page.evaluate(BUCKETS_OF_THE_LAST_DAY)
    index = buckets.index(start.isoformat())
    over = runs_chart.locator(".u-over")
    box = over.bounding_box()
    assert box is not None
    x = box["width"] * index / (len(buckets) - 1)
    over.hover(position={"x": x, "y": box["height"] - 4})
    over.click(position={"x": x, "y": box["height"] - 4})
    page.wait_for_url(re.compile(r"/runs/\?"))
    query = _query(page.url)
    assert _utc(query["from"]) == start
    assert _utc(query["to"]) == start + dt.timedelta(hours=1)

    # The failed figure: the failed runs of the period.
    page.go_back()
    page.get_by_test_id("tile-failed").click()
    page.wait_for_url(re.compile(r"/runs/\?"))
    query = _query(page.url)
    assert query["status"] == "failed" and "from" in query and "to" in query
    page.go_back()
    beta = page.get_by_test_id("agents-by-failures").get_by_role(
        "link", name=re.compile("^beta")
    )
    beta.click()
    page.wait_for_url(re.compile(r"/runs/\?"))
    query = _query(page.url)
    assert (query["status"], query["agent"]) == ("failed", "beta")


def test_login_lands_on_the_overview_and_a_top_tool_opens_the_runs_that_called_it(
    tenant: Any, other_tenant: Any, operator_user: Any, make_member: Any,
    chromium: Any, daphne: Any, transactional_db: Any,
) -> None:  # fmt: skip
    seeded = seed_history(tenant, operator_user, with_budget=True)
    seed_history(other_tenant, make_member(other_tenant, "olga-other", "operator"))
    # A run that called lookup_order without an error: the tool filter lists
    # it, the failures link (which adds has_error=1) does not.
    calm = seeded["runs"][0]
    step = Step.objects.create(run=calm, index=0, started_at=calm.created_at)
    ToolCall.objects.create(
        run=calm, step=step, position=0, call_id="call_calm",
        tool_name="lookup_order", args={}, args_sha256="0" * 64,
        idempotency_key="k-calm", status=ToolCall.Status.SUCCEEDED,
    )  # fmt: skip
    context = chromium.new_context(
        base_url=daphne.url, viewport={"width": 1440, "height": 900}
    )
    try:
        page = context.new_page()
        page.set_default_timeout(20_000)
        # A login without `next` lands on "/", which is the overview.
        page.goto("/login/")
        page.get_by_label("Username").fill(operator_user.username)
        page.get_by_label("Password").fill("pw-" + operator_user.username)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{daphne.url}/")
        nav = page.get_by_role("navigation", name="Main")
        expect(nav.get_by_role("link", name="Overview")).to_have_attribute(
            "aria-current", "page"
        )
        expect(nav.get_by_role("link", name="Runs")).not_to_have_attribute(
            "aria-current", "page"
        )
        expect(page.get_by_role("heading", level=1)).to_contain_text("Overview")
        expect(page.get_by_test_id("tile-runs")).to_have_text("9runs")

        failures = page.get_by_test_id("tools-by-failures")
        expect(failures.get_by_role("listitem")).to_have_text(
            ["lookup_order: 2 failed of 4 calls", "send_refund: 1 failed of 1 calls"]
        )
        failures.get_by_role("link", name=re.compile("^lookup_order")).click()
        # The URL is the filter; the rows below wait for the page itself.
        page.wait_for_url(re.compile(r"/runs/\?"), wait_until="commit")
        query = _query(page.url)
        assert (query["tool"], query["has_error"]) == ("lookup_order", "1")
        assert "from" in query and "to" in query
        rows = page.locator("#runs-body tr[data-run]")
        previews = rows.locator(".input-preview")
        expect(previews).to_have_text(["seeded run 4"])
        expect(rows.locator("td[data-col=agent]")).to_have_text(["beta"])
        filters = page.locator("#filters")
        expect(filters.get_by_label("Tool called")).to_have_value("lookup_order")
        expect(filters.get_by_label("Errors")).to_have_value("1")
        expect(nav.get_by_role("link", name="Runs")).to_have_attribute(
            "aria-current", "page"
        )

        # Without the errors filter: every run of this tenant that called it.
        filters.get_by_label("Errors").select_option("")
        expect(previews).to_have_text(["seeded run 4", "seeded run 0"])
        assert _query(page.url)["tool"] == "lookup_order"
        # The tool filter is cleared like any other: all nine runs again.
        filters.get_by_label("Tool called").fill("")
        filters.get_by_label("Tool called").press("Enter")
        expect(previews).to_have_count(9)
        assert "tool" not in _query(page.url)

        # By cost: the runs that called the tool, the dearest first.
        page.goto("/")
        by_cost = page.get_by_test_id("tools-by-cost")
        by_cost.get_by_role("link", name=re.compile("^send_refund")).click()
        page.wait_for_url(re.compile(r"/runs/\?"))
        query = _query(page.url)
        assert (query["tool"], query["sort"]) == ("send_refund", "-cost")
        expect(previews).to_have_text(["seeded run 4"])
        expect(filters.get_by_label("Tool called")).to_have_value("send_refund")
    finally:
        context.close()


def test_budget_page_shows_burn_down_reservations_and_extensions(
    tenant: Any, operator_user: Any, viewer_user: Any, open_page: Any
) -> None:
    seed_history(tenant, operator_user, with_budget=True)
    page = open_page(viewer_user, "/budget/")
    expect(page.get_by_test_id("forecast-day-cost")).to_contain_text(
        "$1.50 used, $0.20 reserved of $5.00."
    )
    expect(page.get_by_test_id("forecast-month-cost")).to_contain_text("of $80.00.")
    expect(page.get_by_test_id("forecast-day-input_tokens")).to_have_text(
        "0 used; no limit set."
    )
    ledger = page.get_by_test_id("ledger-table").locator("tbody tr")
    expect(ledger).to_have_count(4)
    expect(ledger.filter(has_text="open")).to_have_count(1)
    expect(page.get_by_test_id("ledger-table")).to_contain_text("tool call")
    expect(page.get_by_test_id("ledger-table")).to_contain_text("$0.75")
    expect(page.get_by_test_id("extension-outcomes")).to_have_text(
        "Outcomes: 1 approved, 1 denied."
    )
    denied = page.get_by_test_id("extensions-table").locator("tr", has_text="denied")
    expect(denied).to_contain_text("denied by oscar-operator")
    expect(denied).to_contain_text("enough for today")
    expect(denied).to_contain_text("extend tenant_cost_per_day by $2.50")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "budget-activity.png"), full_page=True)


def test_a_refresh_keeps_the_links_a_person_may_be_clicking(
    tenant: Any, operator_user: Any, open_page: Any
) -> None:
    """A refresh (the 30 s timer, a stream event, the range buttons) used to
    replace every tile and list item: a click whose press landed before it and
    whose release after it fell on a removed link and went nowhere."""
    seed_history(tenant, operator_user, with_budget=True)
    page = open_page(operator_user, "/overview/")
    beta = page.get_by_test_id("agents-by-failures").get_by_role(
        "link", name=re.compile("^beta")
    )
    expect(beta).to_have_text("beta: 2 failed of 3")
    page.evaluate(
        """() => {
          const links = '#tiles a, #top-agents a, #top-tools a';
          window.kept = [...document.querySelectorAll(links)];
          window.rendersBefore = window.cpOverview.renders;
        }"""
    )
    page.get_by_role("button", name="Last 24 hours").click()
    # A function, not an expression: the page's CSP refuses eval of a string.
    page.wait_for_function("() => window.cpOverview.renders > window.rendersBefore")
    assert page.evaluate("window.kept.length") == 6 + 2 + 2 + 2 + 1
    assert page.evaluate("window.kept.filter((a) => !a.isConnected).length") == 0
    expect(beta).to_have_text("beta: 2 failed of 3")
    beta.click()
    page.wait_for_url(re.compile(r"/runs/\?"))
    assert _query(page.url)["agent"] == "beta"
