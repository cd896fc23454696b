"""The eval pages in Chromium against Daphne and a real worker: a suite's cases
read, added, edited and deleted by an operator (a viewer only reads); a suite
file imported and exported; an eval run started from the suite page, its
progress, figures and per-case trials with the graders' reasons; and two eval
runs compared: the flipped case opens the diff of its two trials."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from runs.demo import demo_seed_shop
from runs.models import Agent, EvalCase, EvalRun, EvalSuite, EvalTrial
from runs.services.evals import eval_suite_create
from tests.eval_compare_data import CASES, finished, start, suite_with_two_versions

pytestmark = [
    pytest.mark.browser,
    pytest.mark.worker,
    pytest.mark.usefixtures("runs_settle_before_flush"),
]

SCREENSHOTS = Path(
    os.environ.get("UI_SCREENSHOT_DIR")
    or Path(tempfile.gettempdir()) / "cp-ui-screenshots"
)
LONG = 120_000  # ms: an eval run of real runs on a loaded 2-core box


@pytest.fixture
def demo(tenant: Any, transactional_db: Any) -> Agent:
    demo_seed_shop(tenant=tenant)
    return Agent.objects.get(tenant=tenant, slug="kettlecraft-support")


def _shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


def test_an_operator_edits_a_suites_cases_and_a_viewer_only_reads(
    demo: Agent, operator_user: Any, viewer_user: Any, open_page: Any
) -> None:
    suite_with_two_versions(demo, operator_user)
    page = open_page(operator_user, "/evals/")
    row = page.get_by_test_id("suites").locator("tr[data-suite=kettle]")
    expect(row.locator("[data-col=cases]")).to_have_text("2")
    expect(row.locator("[data-col=last-run]")).to_have_text("never run")
    expect(page.get_by_role("link", name="Evals")).to_have_attribute(
        "aria-current", "page"
    )
    row.get_by_role("link", name="Kettle support").click()
    page.wait_for_url("**/evals/suites/kettle/")
    cases = page.get_by_test_id("cases")
    promised = cases.locator("tr[data-case=replacement-promised]")
    expect(promised.locator("[data-col=input]")).to_have_text(
        "Order #4821 arrived with a dented spout."
    )
    expect(promised.locator("[data-col=graders]")).to_have_text(
        "final_answer_regex pattern=replacement kettle is on"
    )
    expect(promised.locator("[data-col=approvals]")).to_have_text(
        "create_replacement: approve"
    )
    expect(
        cases.locator("tr[data-case=delivery-date] [data-col=graders]")
    ).to_have_text("must_call tool=get_delivery_date")

    # Add a case: a grader naming no tool is refused at its field, nothing written.
    page.get_by_text("Add a case").click()
    page.get_by_label("Case slug").fill("date-asked")
    page.get_by_label("Input").fill("When does order 4821 arrive?")
    page.get_by_label("Graders (JSON list)").fill('[{"kind": "must_call"}]')
    page.get_by_role("button", name="Add case").click()
    expect(page.locator("#case-graders-error")).to_contain_text("graders[0]")
    expect(page.get_by_label("Graders (JSON list)")).to_have_attribute(
        "aria-invalid", "true"
    )
    assert not EvalCase.objects.filter(slug="date-asked").exists()
    page.get_by_label("Graders (JSON list)").fill(
        '[{"kind": "must_call", "tool": "get_delivery_date"}]'
    )
    page.get_by_role("button", name="Add case").click()
    added = cases.locator("tr[data-case=date-asked]")
    expect(added.locator("[data-col=input]")).to_have_text(
        "When does order 4821 arrive?"
    )
    expect(added.locator("[data-col=approvals]")).to_contain_text("none")
    # Saving reloads the page: a button is clicked once its script is in.
    page.wait_for_load_state()

    # Edit it: the form is filled with the case; the row reads the change.
    page.get_by_role("button", name="Edit case date-asked").click()
    expect(page.get_by_label("Graders (JSON list)")).to_have_value(
        re.compile(r'"tool": "get_delivery_date"')
    )
    page.get_by_label("Input").fill("Where is my kettle (order 4821)?")
    page.get_by_role("button", name="Save case").click()
    expect(added.locator("[data-col=input]")).to_have_text(
        "Where is my kettle (order 4821)?"
    )
    assert EvalCase.objects.get(slug="date-asked").input == (
        "Where is my kettle (order 4821)?"
    )

    # Delete takes two clicks.
    page.wait_for_load_state()
    page.get_by_role("button", name="Delete case date-asked").click()
    assert EvalCase.objects.filter(slug="date-asked").exists()
    page.get_by_role("button", name="Really delete case date-asked?").click()
    expect(added).to_have_count(0)
    assert not EvalCase.objects.filter(slug="date-asked").exists()
    _shot(page, "eval-suite.png")

    # A viewer reads the same cases and gets no control that writes; a forged
    # write is refused and changes nothing.
    viewer = open_page(viewer_user, "/evals/suites/kettle/")
    expect(viewer.get_by_test_id("cases").locator("tbody tr")).to_have_count(2)
    for name in ("Edit", "Delete", "Start eval run", "Add case"):
        expect(viewer.get_by_role("button", name=name)).to_have_count(0)
    expect(viewer.get_by_text("Add a case")).to_have_count(0)
    forged = viewer.evaluate(
        """async () => (await fetch("/api/v1/evals/suites/kettle/cases/delivery-date/",
             {method: "DELETE", headers: {"X-CSRFToken": document.cookie.match(
               /csrftoken=([^;]+)/)[1]}})).status"""
    )
    assert forged == 403
    assert EvalCase.objects.filter(slug="delivery-date").exists()
    viewer.goto("/evals/")
    expect(viewer.get_by_text("Import a suite file")).to_have_count(0)


SUITE_FILE = """slug: returns
name: Returns desk
cases:
- slug: asks-date
  input: When does order 4821 arrive?
  graders:
  - {kind: must_call, tool: get_delivery_date}
"""


def test_a_suite_file_is_imported_and_exported_and_a_bad_one_is_refused(
    demo: Agent, operator_user: Any, open_page: Any, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(SUITE_FILE.replace("  graders:", "  gradrs: []\n  graders:"))
    good = tmp_path / "returns.yaml"
    good.write_text(SUITE_FILE)
    page = open_page(operator_user, "/evals/")
    expect(page.get_by_test_id("suites")).to_contain_text("No suites yet.")
    page.get_by_role("button", name="Import").click()
    expect(page.locator("#import-file-error")).to_have_text(
        "Choose a suite file to import."
    )
    page.get_by_label("Suite file (.yaml)").set_input_files(str(bad))
    page.get_by_role("button", name="Import").click()
    expect(page.locator("#import-file-error")).to_contain_text("cases[0].gradrs")
    assert not EvalSuite.objects.exists()
    page.get_by_label("Suite file (.yaml)").set_input_files(str(good))
    page.get_by_role("button", name="Import").click()
    page.wait_for_url("**/evals/suites/returns/")
    expect(page.get_by_role("heading", level=1)).to_contain_text("Returns desk")
    expect(
        page.get_by_test_id("cases").locator("tr[data-case=asks-date] [data-col=input]")
    ).to_have_text("When does order 4821 arrive?")
    export = page.get_by_role("link", name="Export YAML")
    expect(export).to_have_attribute("href", "/api/v1/evals/suites/returns/export/")
    exported = page.request.get("/api/v1/evals/suites/returns/export/")
    assert exported.ok and exported.text().startswith(
        "slug: returns\nname: Returns desk"
    )
    page.goto("/evals/")
    row = page.get_by_test_id("suites").locator("tr[data-suite=returns]")
    expect(row.locator("[data-col=cases]")).to_have_text("1")


def test_an_eval_run_started_on_the_suite_page_shows_its_figures_and_trials(
    demo: Agent, operator_user: Any, open_page: Any
) -> None:
    suite_with_two_versions(demo, operator_user)
    page = open_page(operator_user, "/evals/suites/kettle/")
    page.get_by_label("Agent").select_option("kettlecraft-support")
    expect(page.get_by_label("Version")).to_have_value("2")  # the current one
    page.get_by_label("Version").select_option("1")
    page.get_by_label("Trials per case (k)").fill("0")
    page.get_by_role("button", name="Start eval run").click()
    expect(page.locator("#start-k-error")).to_have_text(
        "k must be a whole number from 1 to 100."
    )
    assert not EvalRun.objects.exists()
    page.get_by_label("Trials per case (k)").fill("2")
    page.get_by_role("button", name="Start eval run").click()
    page.wait_for_url(re.compile(r"/evals/runs/[0-9a-f-]{36}/$"))
    eval_run = EvalRun.objects.get()
    assert (eval_run.agent_version.number, eval_run.k) == (1, 2)

    expect(page.get_by_test_id("eval-progress")).to_have_text(
        "Trials 4/4 graded (100%), 4 passed.", timeout=LONG
    )
    expect(page.get_by_test_id("eval-run-status")).to_have_text("✓ finished")
    figures = page.get_by_test_id("eval-figures")
    expect(figures.get_by_test_id("fig-pass1")).to_contain_text("pass@1100.0%")
    expect(figures.get_by_test_id("fig-pass1")).to_contain_text("95% interval")
    expect(figures.get_by_test_id("fig-passk")).to_have_text(
        "pass@2100.0%at least one of 2 trials passes"
    )
    expect(figures.get_by_test_id("fig-passhatk")).to_have_text(
        "pass^2100.0%all 2 trials pass"
    )
    expect(figures.get_by_test_id("fig-steps")).to_have_text("Mean steps4.0per trial")
    expect(figures.get_by_test_id("fig-cost")).to_contain_text("Mean cost$0")
    expect(figures.get_by_test_id("fig-tokens")).to_contain_text("Mean tokens")
    expect(figures.get_by_test_id("fig-latency")).to_contain_text("Mean latency")

    rows = page.get_by_test_id("eval-cases")
    promised = rows.locator("tr[data-case=replacement-promised]")
    expect(promised.locator("[data-col=passed]")).to_have_text("2/2")
    trials = promised.get_by_test_id("trial")
    expect(trials).to_have_count(2)
    expect(trials.first).to_contain_text("#1 passed")
    expect(trials.first).to_contain_text(
        "final_answer_regex the final answer contains 'replacement kettle is on'"
    )
    expect(
        rows.locator("tr[data-case=delivery-date]").get_by_test_id("trial").first
    ).to_contain_text("must_call called get_delivery_date (1x)")
    first = EvalTrial.objects.get(
        eval_run=eval_run, case_slug="replacement-promised", index=0
    )
    link = trials.first.get_by_test_id("trial-link")
    expect(link).to_have_attribute("href", f"/runs/{first.run_id}/")
    _shot(page, "eval-run.png")
    link.click()
    page.wait_for_url(f"**/runs/{first.run_id}/")


def test_the_comparison_lists_the_flipped_case_whose_link_opens_the_trials_diff(
    demo: Agent, operator_user: Any, open_page: Any
) -> None:
    suite = suite_with_two_versions(demo, operator_user)
    v1 = finished(start(suite, demo, operator_user, version=1, k=2))
    v2 = finished(start(suite, demo, operator_user, version=2, k=2))
    page = open_page(operator_user, f"/evals/runs/{v2.id}/")
    page.get_by_text("Compare with…").click()
    page.get_by_label("Another eval run of kettle").select_option(str(v1.id))
    page.get_by_role("button", name="Compare").click()
    page.wait_for_url(f"**/evals/runs/{v1.id}/compare/{v2.id}/")

    expect(page.get_by_test_id("compare-heading")).to_contain_text(
        "before kettlecraft-support v1 (k=2, 4/4 trials passed), after "
        "kettlecraft-support v2 (k=2, 2/4 trials passed). 2 cases compared at k=2."
    )
    flips = page.get_by_test_id("flip")
    expect(flips).to_have_count(1)
    expect(flips.first).to_contain_text(
        "regressed: passed → failed replacement-promised pass@1 100% → 0%"
    )
    metrics = page.get_by_test_id("compare-metrics")
    pass1 = metrics.locator("tr[data-metric=pass_at_1] td")
    expect(pass1.nth(0)).to_have_text("100.0%")
    expect(pass1.nth(1)).to_have_text("50.0%")
    expect(pass1.nth(2)).to_have_text("−50 pts")
    expect(pass1.nth(3)).to_contain_text("95%: −")
    expect(metrics.locator("tr[data-metric=steps] td").nth(2)).to_have_text("−1.0")
    expect(metrics.locator("tr[data-metric=cost] td").nth(2)).to_have_text("±$0")
    expect(page.get_by_test_id("compare-warning")).to_contain_text(
        "2 cases × 2 trials cannot show a 50-point drop"
    )
    both = page.get_by_test_id("compare-cases")
    expect(both.locator("tr[data-case=replacement-promised] td")).to_have_text(
        ["replacement-promised", "2/2", "0/2", "↓ regressed"]
    )
    expect(both.locator("tr[data-case=delivery-date] td")).to_have_text(
        ["delivery-date", "2/2", "2/2", "–"]
    )
    good = EvalTrial.objects.get(eval_run=v1, case_slug="replacement-promised", index=0)
    bad = EvalTrial.objects.get(eval_run=v2, case_slug="replacement-promised", index=0)
    _shot(page, "eval-compare.png")
    flips.first.get_by_test_id("flip-diff").click()
    page.wait_for_url(f"**/runs/{good.run_id}/diff/{bad.run_id}/")
    expect(page.get_by_test_id("first-divergence")).to_have_count(1)
    expect(page.get_by_test_id("diff-pair").first).to_be_visible()

    # The suites list reads the latest eval run's figures.
    page.goto("/evals/")
    row = page.get_by_test_id("suites").locator("tr[data-suite=kettle]")
    expect(row.locator("[data-col=last-run]")).to_contain_text(
        "kettlecraft-support v2, k=2"
    )
    expect(row.locator("[data-col=pass1]")).to_contain_text("50%")
    expect(row.locator("[data-col=passk]")).to_have_text("50%")

    # An eval run of another suite cannot be compared: the page says why.
    other_suite = eval_suite_create(
        tenant=demo.tenant, actor=operator_user,
        document={"slug": "other", "name": "Other", "cases": CASES[1:]},
    )  # fmt: skip
    other = start(other_suite, demo, operator_user, version=1, k=1)
    page.goto(f"/evals/runs/{v1.id}/compare/{other.id}/")
    expect(page.get_by_test_id("compare-error")).to_have_text(
        f"These eval runs cannot be compared: eval run {str(v1.id)[:8]} is of "
        f"suite 'kettle' and eval run {str(other.id)[:8]} of suite 'other': only "
        "eval runs of one suite can be compared"
    )
    expect(page.get_by_test_id("flip")).to_have_count(0)
