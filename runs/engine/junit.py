"""JUnit XML for eval runs, so any CI shows an eval like a test run.

One <testsuite> per eval run, one <testcase> per case. A case fails in JUnit when
any of its trials failed (pass^k is the figure production cares about); the failure
lists each failed trial with its graders' reasons. The suite's figures go in
<properties>. Characters XML 1.0 cannot carry (terminal escapes in a model's answer)
are dropped so the file always parses.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from runs.engine.eval_metrics import CaseSummary, SuiteSummary

_NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass(frozen=True)
class JUnitRun:
    """One eval run to write: the suite's name, its summary, and where it came from."""

    name: str
    summary: SuiteSummary
    run_id: str = ""
    timestamp: datetime | None = None
    properties: Mapping[str, str] = field(default_factory=dict)


def junit_xml(runs: Sequence[JUnitRun]) -> str:
    """A JUnit XML document (UTF-8 text with declaration) for one or more eval runs."""
    root = ET.Element("testsuites")
    total_tests = total_failures = 0
    total_time = 0.0
    for run in runs:
        suite = _testsuite(run)
        root.append(suite)
        total_tests += len(run.summary.cases)
        total_failures += int(suite.get("failures", "0"))
        total_time += sum(c.total_latency_ms for c in run.summary.cases) / 1000
    root.set("tests", str(total_tests))
    root.set("failures", str(total_failures))
    root.set("errors", "0")
    root.set("time", f"{total_time:.3f}")
    ET.indent(root)
    body = ET.tostring(root, encoding="unicode")
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{body}\n'


def _testsuite(run: JUnitRun) -> ET.Element:
    summary = run.summary
    failures = [c for c in summary.cases if c.failed_trials]
    suite = ET.Element(
        "testsuite",
        {
            "name": _clean(run.name),
            "tests": str(len(summary.cases)),
            "failures": str(len(failures)),
            "errors": "0",
            "skipped": "0",
            "time": f"{sum(c.total_latency_ms for c in summary.cases) / 1000:.3f}",
        },
    )
    if run.run_id:
        suite.set("id", _clean(run.run_id))
    if run.timestamp is not None:
        suite.set("timestamp", run.timestamp.isoformat())
    properties = ET.SubElement(suite, "properties")
    for name, value in {**_figures(summary), **run.properties}.items():
        ET.SubElement(properties, "property", name=_clean(name), value=_clean(value))
    for case in summary.cases:
        suite.append(_testcase(run.name, case))
    return suite


def _figures(summary: SuiteSummary) -> dict[str, str]:
    interval = summary.pass_at_1_interval
    return {
        "k": str(summary.k),
        "cases": str(len(summary.cases)),
        "trials": str(summary.trials),
        "pass@1": f"{summary.pass_at_1:.4f}",
        "pass@1.interval": f"{interval.low:.4f}..{interval.high:.4f}",
        "pass@1.confidence": f"{interval.confidence:g}",
        "pass@k": f"{summary.pass_at_k:.4f}",
        "pass^k": f"{summary.pass_hat_k:.4f}",
        "cost.mean": str(summary.mean_cost),
        "cost.total": str(summary.total_cost),
        "tokens.mean": f"{summary.mean_tokens:.1f}",
        "steps.mean": f"{summary.mean_steps:.2f}",
        "latency_ms.mean": f"{summary.mean_latency_ms:.1f}",
    }


def _testcase(suite_name: str, case: CaseSummary) -> ET.Element:
    testcase = ET.Element(
        "testcase",
        {
            "name": _clean(case.case_id),
            "classname": _clean(suite_name),
            "time": f"{case.total_latency_ms / 1000:.3f}",
        },
    )
    failed = case.failed_trials
    if failed:
        failure = ET.SubElement(
            testcase,
            "failure",
            message=f"{len(failed)} of {case.n} trials failed (pass@1 "
            f"{case.pass_at_1:.2f}, pass^k {case.pass_hat_k:.2f})",
            type="EvalFailure",
        )
        failure.text = "\n".join(
            _clean(_trial_line(i, case)) for i in _failed_indexes(case)
        )
    return testcase


def _failed_indexes(case: CaseSummary) -> list[int]:
    return [i for i, trial in enumerate(case.trials) if not trial.passed]


def _trial_line(index: int, case: CaseSummary) -> str:
    trial = case.trials[index]
    label = trial.trial_id or f"#{index + 1}"
    reasons = "; ".join(trial.reasons) if trial.reasons else "no grader reason recorded"
    return f"trial {label}: {reasons}"


def _clean(text: str) -> str:
    return _NOT_XML.sub("", text)
