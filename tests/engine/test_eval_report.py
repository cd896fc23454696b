"""Terminal lines for an eval run: progress, one line per case, the summary."""

from __future__ import annotations

import pytest

from runs.engine.eval_metrics import summarise_case, summarise_suite
from runs.engine.eval_report import (
    case_report_line,
    case_status,
    progress_line,
    suite_report_lines,
)
from tests.engine.eval_trials import trials


def test_progress_line_shows_done_total_bar_percent_and_passed() -> None:
    assert (
        progress_line(12, 100, 9, width=10)
        == "trials 12/100 [#.........] 12%  passed 9"
    )
    assert progress_line(50, 100, 40, width=10).startswith("trials 50/100 [#####.....]")
    assert progress_line(0, 3, 0, width=3) == "trials 0/3 [...] 0%  passed 0"
    assert progress_line(3, 3, 2, width=3) == "trials 3/3 [###] 100%  passed 2"


@pytest.mark.parametrize(
    ("done", "total", "passed", "named"),
    [
        (1, 0, 0, "total=0"),
        (5, 4, 0, "done=5"),
        (2, 4, 3, "passed=3"),
        (-1, 4, 0, "done=-1"),
    ],
)
def test_progress_line_refuses_impossible_counts(
    done: int, total: int, passed: int, named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        progress_line(done, total, passed)


def test_case_status_is_pass_flaky_or_fail() -> None:
    assert case_status(summarise_case("a", trials("a", 3, 3), k=1)) == "PASS"
    assert case_status(summarise_case("a", trials("a", 3, 1), k=1)) == "FLAKY"
    assert case_status(summarise_case("a", trials("a", 3, 0), k=1)) == "FAIL"


def test_case_line_names_the_case_its_rates_and_first_reason() -> None:
    case = summarise_case(
        "task_07",
        trials("task_07", 5, 3, cost="0.0123", latency_ms=2400, reason="no apology\n!"),
        k=5,
    )
    assert case_report_line(case) == (
        "FLAKY task_07  3/5 passed  pass@1 0.60  pass^k 0.00  cost 0.0123  2.4 s"
        "  - no apology !"
    )


def test_suite_lines_end_with_the_figures_and_interval() -> None:
    summary = summarise_suite(trials("a", 2, 2) + trials("b", 2, 1), k=2)
    lines = suite_report_lines(summary)
    assert [line.split()[0:2] for line in lines[:2]] == [["PASS", "a"], ["FLAKY", "b"]]
    assert lines[2].startswith("2 cases, 4 trials, k=2: pass@1 0.75 (95% interval ")
    assert "pass@k 1.00  pass^k 0.50  cost 0.0100/trial" in lines[2]
