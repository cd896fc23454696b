"""The runs list in Chromium: each filter, the search, the sort and the column
chooser show the rows a person expects, the URL keeps them (reload, back and
forward, a link from the overview), a bad filter says which and why, and a run
that stops matching leaves the list live."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from runs.models import Run
from tests.run_list_data import RUNS, seed_run_list

pytestmark = [pytest.mark.browser]

SCREENSHOTS = Path(
    os.environ.get("UI_SCREENSHOT_DIR")
    or Path(tempfile.gettempdir()) / "cp-ui-screenshots"
)
INPUT = {name: row[2] for name, row in RUNS.items()}
NEWEST_FIRST = ["ping", "catalogue", "invoices", "lid", "parcel", "refund"]


@pytest.fixture
def listed(tenant: Any, operator_user: Any, transactional_db: Any) -> dict[str, Run]:
    return seed_run_list(tenant, operator_user)


def open_list(open_page: Any, user: Any, url: str) -> Any:
    """Log in, then open the list at `url` (a query's "?" is a wildcard to the
    login fixture's URL wait)."""
    page = open_page(user, "/runs/")
    page.goto(url)
    return page


def expect_rows(page: Any, names: list[str]) -> None:
    """The runs' inputs, as the rows read, in this order."""
    previews = page.locator("#runs-body tr[data-run] .input-preview")
    if names:
        expect(previews).to_have_text([INPUT[name] for name in names])
    else:
        expect(previews).to_have_count(0)


def test_filters_are_applied_by_the_server_and_kept_in_the_url(
    listed: Any, operator_user: Any, open_page: Any
) -> None:
    page = open_page(operator_user, "/runs/")
    expect_rows(page, NEWEST_FIRST)
    expect(page.locator("#runs-count")).to_have_text("6 shown of 6")

    page.locator("#filters").get_by_label("Status").select_option("failed")
    expect_rows(page, ["parcel"])
    expect(page).to_have_url(re.compile(r"/runs/\?status=failed$"))

    page.locator("#filters").get_by_label("Status").select_option("")
    page.locator("#filters").get_by_label("Waiting on").select_option("budget")
    expect_rows(page, ["invoices"])
    expect(page.locator("#runs-body tr[data-run] td[data-col=waiting]")).to_have_text(
        "‖ budget extension"
    )
    page.locator("#filters").get_by_label("Waiting on").select_option("input")
    expect_rows(page, ["catalogue"])
    page.locator("#filters").get_by_label("Waiting on").select_option("approval")
    expect_rows(page, ["lid"])

    page.locator("#filters").get_by_label("Waiting on").select_option("")
    page.locator("#filters").get_by_label("Errors").select_option("1")
    expect_rows(page, ["ping", "parcel"])
    page.locator("#filters").get_by_label("Cost above").fill("0.5")
    page.locator("#filters").get_by_label("Cost above").press("Tab")
    expect_rows(page, ["parcel"])
    expect(page).to_have_url(re.compile(r"has_error=1&cost_gt=0\.5|cost_gt=0\.5"))

    page.get_by_role("button", name="Clear filters").click()
    expect_rows(page, NEWEST_FIRST)
    end_user = page.locator("#filters").get_by_label("End user")
    end_user.fill("c-8812")
    end_user.press("Enter")
    expect_rows(page, ["lid", "refund"])
    expect(page).to_have_url(re.compile(r"/runs/\?end_user=c-8812$"))
    page.get_by_role("button", name="Clear filters").click()
    expect_rows(page, NEWEST_FIRST)
    expect(end_user).to_have_value("")
    page.locator("#filters").get_by_label("Agent", exact=True).select_option("beta")
    expect_rows(page, ["catalogue", "invoices", "lid"])
    # Chromium runs in UTC here: the local time typed is the instant sent.
    page.locator("#filters").get_by_label("Created from").fill("2026-11-03T10:00")
    expect_rows(page, ["catalogue", "invoices"])
    page.locator("#filters").get_by_label("Created before").fill("2026-11-04T00:00")
    expect_rows(page, ["invoices"])
    expect(page).to_have_url(
        re.compile(
            r"agent=beta&from=2026-11-03T10%3A00%3A00Z&to=2026-11-04T00%3A00%3A00Z"
        )
    )

    # Reload, back and forward: the URL is the list's state.
    page.reload()
    expect_rows(page, ["invoices"])
    expect(page.locator("#filters").get_by_label("Agent", exact=True)).to_have_value(
        "beta"
    )
    expect(page.locator("#filters").get_by_label("Created from")).to_have_value(
        "2026-11-03T10:00"
    )
    page.go_back()
    expect_rows(page, ["catalogue", "invoices"])
    expect(page.locator("#filters").get_by_label("Created before")).to_have_value("")
    page.go_back()
    expect_rows(page, ["catalogue", "invoices", "lid"])
    page.go_back()
    expect_rows(page, NEWEST_FIRST)
    expect(page.locator("#filters").get_by_label("Agent", exact=True)).to_have_value("")
    page.go_forward()
    expect_rows(page, ["catalogue", "invoices", "lid"])


def test_search_finds_words_in_the_input_or_the_final_answer(
    listed: Any, operator_user: Any, open_page: Any
) -> None:
    page = open_page(operator_user, "/runs/")
    expect_rows(page, NEWEST_FIRST)
    search = page.locator("#filters").get_by_label("Search")
    search.fill("KETTLE")
    expect_rows(page, ["refund"])
    search.fill("leeds")  # only in the final answer "Pong from Leeds"
    expect_rows(page, ["ping"])
    search.fill("refund parcel")
    expect_rows(page, [])
    expect(page.locator("#runs-body")).to_have_text("No run matches the filters.")
    search.fill("the")
    page.locator("#filters").get_by_label("Agent", exact=True).select_option("beta")
    expect_rows(page, ["catalogue", "invoices", "lid"])
    expect(page).to_have_url(re.compile(r"agent=beta&q=the"))
    page.reload()
    expect(page.locator("#filters").get_by_label("Search")).to_have_value("the")
    expect_rows(page, ["catalogue", "invoices", "lid"])


def test_sorting_by_a_column_header_is_kept_in_the_url(
    listed: Any, operator_user: Any, open_page: Any
) -> None:
    page = open_page(operator_user, "/runs/")
    expect_rows(page, NEWEST_FIRST)
    cost = page.get_by_role("columnheader", name="Cost")
    page.get_by_role("button", name="Cost").click()
    expect_rows(page, ["parcel", "invoices", "catalogue", "ping", "refund", "lid"])
    expect(cost).to_have_attribute("aria-sort", "descending")
    expect(page).to_have_url(re.compile(r"sort=-cost$"))
    page.get_by_role("button", name="Cost").click()
    expect_rows(page, ["lid", "ping", "refund", "catalogue", "invoices", "parcel"])
    expect(cost).to_have_attribute("aria-sort", "ascending")
    page.get_by_role("button", name="Agent").click()  # text: A→Z first
    expect_rows(page, ["ping", "parcel", "refund", "catalogue", "invoices", "lid"])
    page.reload()
    expect_rows(page, ["ping", "parcel", "refund", "catalogue", "invoices", "lid"])
    expect(page.get_by_role("columnheader", name="Agent")).to_have_attribute(
        "aria-sort", "ascending"
    )
    page.go_back()
    expect_rows(page, ["lid", "ping", "refund", "catalogue", "invoices", "parcel"])
    page.get_by_role("button", name="Waiting on").click()
    expect_rows(page, ["catalogue", "invoices", "lid", "ping", "parcel", "refund"])


def test_the_column_chooser_is_remembered_by_this_browser(
    listed: Any, operator_user: Any, open_page: Any
) -> None:
    page = open_list(open_page, operator_user, "/runs/?agent=alpha&sort=-cost")
    headers = page.locator("#runs-head th")
    expect(headers).to_have_text(
        ["Status", "Run", "Agent", "Started by", "Created", "Duration", "Steps",
         "Tokens", "Cost ▼", "Waiting on"]
    )  # fmt: skip
    page.get_by_text("Columns", exact=True).click()
    page.locator("#column-options").get_by_label("Agent").uncheck()
    page.locator("#column-options").get_by_label("Started by").uncheck()
    page.locator("#column-options").get_by_label("Final answer").check()
    expected = ["Status", "Run", "Created", "Duration", "Steps", "Tokens",
                "Cost ▼", "Waiting on", "Final answer"]  # fmt: skip
    expect(headers).to_have_text(expected)
    answers = page.locator("#runs-body td[data-col=answer]")
    expect(answers).to_have_text(
        ["–", "Pong from Leeds", "Refund issued for the kettle"]
    )
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(SCREENSHOTS / "runs-list-filters.png"))

    page.reload()
    expect(headers).to_have_text(expected)
    expect(answers).to_have_count(3)
    # Another browser has its own choice: the defaults.
    other = open_page(operator_user, "/runs/")
    expect(other.locator("#runs-head th")).to_have_count(10)
    expect(other.locator("#runs-body td[data-col=answer]")).to_have_count(0)


def test_a_link_from_the_overview_opens_the_filtered_list(
    listed: Any, operator_user: Any, open_page: Any
) -> None:
    page = open_list(
        open_page,
        operator_user,
        "/runs/?status=failed&agent=alpha&from=2026-11-02T00:00:00Z"
        "&to=2026-11-03T00:00:00Z",
    )
    expect_rows(page, ["parcel"])
    expect(page.locator("#filters").get_by_label("Status")).to_have_value("failed")
    expect(page.locator("#filters").get_by_label("Agent", exact=True)).to_have_value(
        "alpha"
    )
    expect(page.locator("#filters").get_by_label("Created from")).to_have_value(
        "2026-11-02T00:00"
    )


def test_the_tool_filter_lists_the_runs_that_called_it(
    listed: Any, operator_user: Any, open_page: Any
) -> None:
    page = open_page(operator_user, "/runs/")
    expect_rows(page, NEWEST_FIRST)
    tool = page.locator("#filters").get_by_label("Tool called")
    tool.fill("lookup_order")
    tool.press("Tab")
    # `refund` called it twice: listed once.
    expect_rows(page, ["lid", "parcel", "refund"])
    expect(page).to_have_url(re.compile(r"/runs/\?tool=lookup_order$"))
    page.locator("#filters").get_by_label("Agent", exact=True).select_option("beta")
    expect_rows(page, ["lid"])
    page.reload()
    expect_rows(page, ["lid"])
    expect(tool).to_have_value("lookup_order")
    tool.fill("run_code")
    tool.press("Enter")
    expect_rows(page, [])
    expect(page.locator("#runs-body")).to_have_text("No run matches the filters.")
    page.go_back()
    expect_rows(page, ["lid"])
    expect(tool).to_have_value("lookup_order")

    # A name no tool can have is refused at the field; clearing it recovers.
    page.goto("/runs/?tool=lookup.order")
    expect(page.locator("#runs-error")).to_contain_text(
        "Tool called: a tool name is 1 to 64 letters, digits, _ or -"
    )
    expect(tool).to_have_attribute("aria-invalid", "true")
    tool.fill("")
    tool.press("Enter")
    expect_rows(page, NEWEST_FIRST)
    expect(page).to_have_url(re.compile(r"/runs/$"))


def test_a_bad_filter_in_the_url_says_which_and_why(
    listed: Any, operator_user: Any, open_page: Any
) -> None:
    page = open_list(
        open_page, operator_user, "/runs/?from=yesterday&cost_gt=-1&status=bogus"
    )
    error = page.locator("#runs-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("These filters cannot be applied")
    expect(error).to_contain_text("Created from: not an ISO 8601 date or time")
    expect(error).to_contain_text("Cost above:")
    expect(error).to_contain_text("Status:")
    expect(page.locator("#f-cost_gt-error")).to_contain_text(
        "greater than or equal to 0"
    )
    expect(page.locator("#filters").get_by_label("Cost above")).to_have_attribute(
        "aria-invalid", "true"
    )
    expect(page.locator("#runs-body")).to_have_text(
        "No runs shown: a filter above cannot be applied."
    )
    # Fixing them brings the rows back and the messages go.
    page.get_by_role("button", name="Clear filters").click()
    expect_rows(page, NEWEST_FIRST)
    expect(error).to_be_hidden()
    expect(page.locator("#f-cost_gt-error")).to_have_text("")


def test_a_run_that_stops_matching_leaves_the_list_live(
    listed: dict[str, Run], operator_user: Any, open_page: Any
) -> None:
    page = open_list(open_page, operator_user, "/runs/?waiting=approval")
    expect_rows(page, ["lid"])
    # Decided elsewhere and finished: the list's next read (the run was
    # unfinished, so the list re-reads) no longer holds it, and says so.
    lid = listed["lid"]
    ApprovalRequest.objects.filter(run=lid).update(
        status=ApprovalRequest.Status.APPROVED
    )
    Run.objects.filter(pk=lid.pk).update(status=Run.Status.SUCCEEDED)
    expect_rows(page, [])
    expect(page.locator("#runs-left")).to_contain_text("1 run left the list at")
    expect(page.locator("#runs-left")).to_contain_text("no longer matching the filters")
