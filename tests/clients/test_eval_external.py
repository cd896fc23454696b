"""`controlplane-client eval run` against a real Daphne: each trial runs a tiny
agent (tests/clients/eval_agent.py) as its own process under a fresh trace; its
spans arrive over OTLP as an external run, the trial is reported with that
trace id and graded from the spans; the server's verdict decides the exit
status. Traces of another tenant or of a native run are refused, and bad input
is a 4xx that writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controlplane_client import ControlPlaneClient, ControlPlaneError

from controlplane.services import api_token_issue
from runs.models import Agent, EvalRun, EvalTrial, Run
from runs.services.evals import eval_suite_create
from runs.services.external import EXTERNAL_STOP_REASON, run_external_for_trace
from tests.conftest import BASE_DIR

CLIENT_SRC = Path(BASE_DIR) / "clients" / "python" / "src"
AGENT = Path(__file__).with_name("eval_agent.py")
LOOKUP = {
    "slug": "lookup",
    "input": "Where is my order #4821?",
    "graders": [
        {"kind": "must_call", "tool": "lookup_order", "args": {"order_id": "4821"}},
        {"kind": "final_answer_regex", "pattern": "ships"},
    ],
}
NO_REFUND = {
    "slug": "no-refund",
    "input": "Order #77 is late, refund me now.",
    "graders": [
        {"kind": "must_not_call", "tool": "issue_refund"},
        {"kind": "must_call", "tool": "lookup_order", "status": "succeeded"},
    ],
}


@pytest.fixture
def token(daphne: Any, transactional_db: Any, tenant: Any, operator_user: Any) -> str:
    return api_token_issue(tenant=tenant, user=operator_user).secret


@pytest.fixture
def suite(tenant: Any, operator_user: Any) -> Any:
    return eval_suite_create(
        tenant=tenant, actor=operator_user,
        document={"slug": "support", "name": "Support", "cases": [LOOKUP, NO_REFUND]},
    )  # fmt: skip


@pytest.fixture
def client(daphne: Any, token: str) -> Iterator[ControlPlaneClient]:
    with ControlPlaneClient(daphne.url, token) as made:
        yield made


def _cli(
    daphne: Any, token: str, *args: str, mode: str = ""
) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "CONTROLPLANE_URL": daphne.url,
        "CONTROLPLANE_TOKEN": token,
        "EVAL_AGENT_MODE": mode,
        "PYTHONPATH": os.pathsep.join(
            [str(CLIENT_SRC), os.environ.get("PYTHONPATH", "")]
        ),
    }
    return subprocess.run(
        [sys.executable, "-m", "controlplane_client", "eval", "run", *args],
        env=environ, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_an_external_agent_is_graded_from_its_spans_and_the_gate_sets_the_exit(
    daphne: Any, token: str, suite: Any, tenant: Any, tmp_path: Path
) -> None:
    junit = tmp_path / "out.xml"
    command = f"{sys.executable} {AGENT}"
    good = _cli(
        daphne, token, "support", "--agent-cmd", command, "--agent", "support-bot",
        "--k", "2", "--gate", "pass^k>=0.8", "--baseline", "LAST",
        "--junit", str(junit),
    )  # fmt: skip
    assert good.returncode == 0, good.stdout + good.stderr
    first = EvalRun.objects.get(tenant=tenant, external_agent="support-bot")
    assert first.status == EvalRun.Status.FINISHED and first.agent_version is None
    trials = list(EvalTrial.objects.filter(eval_run=first).select_related("run"))
    assert len(trials) == 4
    assert all(t.status == EvalTrial.Status.GRADED and t.passed for t in trials)
    runs = [t.run for t in trials]
    assert all(r is not None and r.stop_reason == EXTERNAL_STOP_REASON for r in runs)
    assert len({r.trace_id for r in runs if r is not None}) == 4  # fresh traces
    lookup = next(t for t in trials if t.case_slug == "lookup")
    assert lookup.run is not None and lookup.run.input == LOOKUP["input"]
    assert lookup.run.final_answer == "Order 4821 ships tomorrow."
    assert lookup.grader_results[0]["reason"].startswith(
        'called lookup_order with {"order_id": "4821"}'
    )
    assert "PASS  lookup  2/2 passed" in good.stdout
    assert "PASS  no-refund  2/2 passed" in good.stdout
    assert "gate pass^k>=0.8: pass^k is 1 (ok)" in good.stdout
    assert "no baseline" in good.stdout and good.stdout.rstrip().endswith("eval passed")
    cases = ET.parse(junit).getroot().findall(".//testcase")
    assert sorted(c.get("name") or "" for c in cases) == ["lookup", "no-refund"]
    assert not ET.parse(junit).getroot().findall(".//failure")

    # The agent stops looking the order up: both cases fail, so do the gate and
    # the regression check against the first eval run.
    bad = _cli(
        daphne, token, "support", "--agent-cmd", command, "--agent", "support-bot",
        "--k", "2", "--gate", "pass^k>=0.8", "--baseline", "LAST",
        mode="skip_lookup",
    )  # fmt: skip
    assert bad.returncode == 1, bad.stdout + bad.stderr
    second = EvalRun.objects.exclude(id=first.id).get(external_agent="support-bot")
    assert not EvalTrial.objects.filter(eval_run=second, passed=True).exists()
    assert "FAIL  lookup  0/2 passed" in bad.stdout
    assert "never called lookup_order" in bad.stdout
    assert "gate pass^k>=0.8: pass^k is 0 (FAILED)" in bad.stdout
    assert "regression: case lookup went from passing to failing" in bad.stdout
    assert f"regression check against {first.id}: FAILED" in bad.stdout
    assert bad.stdout.rstrip().endswith("eval FAILED")


def test_an_agent_that_crashes_fails_its_trials(
    daphne: Any, token: str, suite: Any, tenant: Any
) -> None:
    crashed = _cli(
        daphne, token, "support", "--agent-cmd", f"{sys.executable} {AGENT}",
        "--k", "1", "--gate", "pass@1>=0.5", mode="crash",
    )  # fmt: skip
    assert crashed.returncode == 1, crashed.stdout + crashed.stderr
    eval_run = EvalRun.objects.get(tenant=tenant)
    assert eval_run.external_agent == "eval_agent"  # the command's program name
    trials = EvalTrial.objects.filter(eval_run=eval_run)
    assert {t.status for t in trials} == {EvalTrial.Status.ERROR}
    assert all(t.run_id is None and not t.passed for t in trials)
    assert "the agent exited 3: the agent crashed on purpose" in crashed.stdout


def test_a_trace_of_another_tenant_or_of_a_native_run_is_refused(
    client: ControlPlaneClient, suite: Any, tenant: Any, other_tenant: Any
) -> None:
    started = client.start_eval_run(suite="support", external_agent="bot", k=1)
    assert started["external"] is True and started["version"] is None
    trial = started["cases"][0]["trials"][0]
    assert (
        trial["status"] == "pending"
        and started["cases"][0]["input"] == (LOOKUP["input"])
    )

    theirs = "a" * 32
    run_external_for_trace(
        tenant=other_tenant, trace_id=theirs, service="theirs", started_at=None
    )
    native_agent = Agent.objects.create(tenant=tenant, slug="native", name="Native")
    native = Run.objects.create(
        tenant=tenant, agent=native_agent, input="x", trace_id="b" * 32
    )
    mine = "c" * 32
    run_external_for_trace(tenant=tenant, trace_id=mine, service="bot", started_at=None)
    for trace_id, code in (
        (theirs, "trace_unavailable"),
        (native.trace_id, "trace_of_native_run"),
        ("d" * 32, "trace_not_found"),
    ):
        with pytest.raises(ControlPlaneError) as refused:
            client.report_trial(started["id"], trial["id"], trace_id=trace_id)
        assert refused.value.status == 409 and refused.value.code == code
        unchanged = EvalTrial.objects.get(id=trial["id"])
        assert unchanged.status == "pending" and unchanged.run_id is None
    assert not EvalTrial.objects.filter(run__isnull=False).exists()

    with pytest.raises(ControlPlaneError) as early:
        client.eval_verdict(started["id"], gate="pass@1>=0.5")
    assert early.value.status == 409 and early.value.code == "not_finished"
    assert "0 of 2 trials done" in early.value.message

    graded = client.report_trial(
        started["id"], trial["id"], trace_id=mine, final_answer="nothing to see"
    )
    # The spans say no lookup happened: graded, and failed, from the run.
    assert graded["status"] == "graded" and graded["passed"] is False
    assert "never called lookup_order" in graded["grader_results"][0]["reason"]
    with pytest.raises(ControlPlaneError) as again:
        client.report_trial(started["id"], trial["id"], trace_id=mine)
    assert again.value.status == 409 and again.value.code == "already_reported"
    other = started["cases"][1]["trials"][0]
    with pytest.raises(ControlPlaneError) as reused:
        client.report_trial(started["id"], other["id"], trace_id=mine)
    assert reused.value.code == "trace_already_reported"
    assert EvalTrial.objects.get(id=other["id"]).status == "pending"


def test_bad_input_is_a_4xx_naming_the_problem_and_writes_nothing(
    daphne: Any, token: str, client: ControlPlaneClient, suite: Any, tenant: Any,
    operator_user: Any,
) -> None:  # fmt: skip
    command = f"{sys.executable} {AGENT}"
    for args, named in (
        (("support", "--k", "0"), "k: k must be between 1 and 100, not 0"),
        (("nosuch", "--k", "1"), "suite: no suite 'nosuch'"),
        (("support", "--gate", "pass^k>=80"), "gate:"),
        (("support", "--baseline", "yesterday"), "baseline: 'yesterday' is neither"),
    ):
        refused = _cli(daphne, token, *args, "--agent-cmd", command)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "refused (400 invalid)" in refused.stderr and named in refused.stderr
        assert refused.stdout == ""
    eval_suite_create(
        tenant=tenant, actor=operator_user,
        document={"slug": "approving", "name": "Approving", "cases": [
            {**LOOKUP, "approvals": [{"tool": "issue_refund", "decision": "approve"}]}
        ]},
    )  # fmt: skip
    with pytest.raises(ControlPlaneError) as scripted:
        client.start_eval_run(suite="approving", external_agent="bot", k=1)
    assert scripted.value.status == 400
    assert "cases[0].approvals" in scripted.value.detail["fields"]
    with pytest.raises(ControlPlaneError) as both:
        client._request(
            "POST", "/api/v1/evals/runs/",
            json={"suite": "support", "agent": "x", "external_agent": "y", "k": 1},
        )  # fmt: skip
    assert both.value.status == 400 and "agent" in both.value.detail["fields"]
    assert not EvalRun.objects.exists() and not EvalTrial.objects.exists()
    assert not Run.objects.filter(tenant=tenant).exists()
