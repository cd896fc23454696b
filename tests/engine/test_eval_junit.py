"""JUnit XML for eval runs, checked by parsing it back."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from decimal import Decimal

from runs.engine.eval_metrics import TrialOutcome, summarise_suite
from runs.engine.junit import JUnitRun, junit_xml
from tests.engine.eval_trials import trials


def test_one_testsuite_per_run_and_one_testcase_per_case_round_trip() -> None:
    summary = summarise_suite(
        trials("task_07", 3, 3, latency_ms=1500)
        + trials(
            "deny_path", 3, 1, latency_ms=1000, reason="called create_replacement"
        ),
        k=3,
    )
    started = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    document = junit_xml(
        [
            JUnitRun(
                "kettlecraft",
                summary,
                run_id="eval-1",
                timestamp=started,
                properties={"agent": "kettlecraft@3"},
            )
        ]
    )
    assert document.startswith('<?xml version="1.0" encoding="UTF-8"?>')
    root = ET.fromstring(document.encode("utf-8"))
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures")) == ("2", "1")
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "kettlecraft"
    assert suite.get("id") == "eval-1"
    assert suite.get("timestamp") == "2026-05-01T12:00:00+00:00"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == (
        "2",
        "1",
        "0",
    )
    assert suite.get("time") == "7.500"
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["pass@1"] == "0.6667"
    assert properties["pass^k"] == "0.5000"
    assert properties["pass@k"] == "1.0000"
    assert properties["k"] == "3"
    assert properties["cost.total"] == "0.06"
    assert properties["agent"] == "kettlecraft@3"
    assert properties["pass@1.interval"].count("..") == 1

    passing, failing = suite.findall("testcase")
    assert (passing.get("name"), passing.get("classname")) == ("task_07", "kettlecraft")
    assert passing.get("time") == "4.500"
    assert passing.find("failure") is None
    failure = failing.find("failure")
    assert failure is not None
    assert failure.get("message") == "2 of 3 trials failed (pass@1 0.33, pass^k 0.00)"
    assert failure.text == (
        "trial deny_path-2: called create_replacement\n"
        "trial deny_path-3: called create_replacement"
    )


def test_several_runs_make_several_testsuites() -> None:
    first = summarise_suite(trials("a", 2, 2), k=1)
    second = summarise_suite(trials("a", 2, 0) + trials("b", 2, 2), k=1)
    root = ET.fromstring(junit_xml([JUnitRun("v1", first), JUnitRun("v2", second)]))
    assert [s.get("name") for s in root.findall("testsuite")] == ["v1", "v2"]
    assert (root.get("tests"), root.get("failures")) == ("3", "1")


def test_reasons_with_markup_and_control_characters_still_parse() -> None:
    outcome = TrialOutcome(
        case_id='inject <note> & "quote"',
        passed=False,
        cost=Decimal("0.01"),
        tokens=10,
        steps=1,
        latency_ms=10,
        reasons=("judge: answer had \x1b[31mred\x1b[0m </failure> & \x00nul",),
    )
    document = junit_xml([JUnitRun("suite", summarise_suite([outcome], k=1))])
    root = ET.fromstring(document)
    case = root.find("testsuite/testcase")
    assert case is not None
    assert case.get("name") == 'inject <note> & "quote"'
    failure = case.find("failure")
    assert failure is not None
    assert failure.text == "trial #1: judge: answer had [31mred[0m </failure> & nul"


def test_failed_trial_without_reasons_says_so() -> None:
    outcome = TrialOutcome("a", False, Decimal(0), 0, 0, 0)
    root = ET.fromstring(junit_xml([JUnitRun("s", summarise_suite([outcome], k=1))]))
    failure = root.find("testsuite/testcase/failure")
    assert failure is not None
    assert failure.text == "trial #1: no grader reason recorded"
