"""`controlplane-client eval run SUITE --agent-cmd "..." --k 5 --gate ... --baseline
LAST --junit out.xml`: the CI gate for an agent that runs outside.

Each trial runs the agent command once: the case input on stdin, a fresh trace
in the environment (`TRACEPARENT`, `CONTROLPLANE_TRACE_ID`), its stdout taken as
the final answer. The agent sends its spans over OTLP; the trial is reported
with its trace id and the server grades it from the external run. The case
lines, the gate, the regression check and the JUnit XML are the server's
(`GET /api/v1/evals/runs/<id>/verdict/`): nothing is recomputed here.

Exit status: 0 the gate and regression check passed, 1 one failed, 2 the
command or the server refused (a bad gate, an unknown suite, k out of range).
The token is read from CONTROLPLANE_TOKEN, the address from CONTROLPLANE_URL.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from controlplane_client.client import ControlPlaneClient
from controlplane_client.models import ControlPlaneError
from controlplane_client.tracecontext import TRACE_ID_ENV, TRACEPARENT_ENV

# How long a report waits for the agent's spans to arrive (they are flushed
# before the agent exits, so this covers only the ingest in flight).
SPANS_WAIT_SECONDS = 15.0
POLL_SECONDS = 0.5
ERROR_TAIL_CHARS = 1000


def main(argv: list[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    token = os.environ.get("CONTROLPLANE_TOKEN")
    if not token:
        print(
            "CONTROLPLANE_TOKEN is not set (an operator's API token)", file=sys.stderr
        )
        return 2
    base_url = os.environ.get("CONTROLPLANE_URL", "http://127.0.0.1:8000")
    command = shlex.split(options.agent_cmd)
    if not command:
        print("--agent-cmd is empty", file=sys.stderr)
        return 2
    with ControlPlaneClient(base_url, token) as client:
        try:
            return _eval_run(client, options, command, sys.stdout)
        except ControlPlaneError as refused:
            print(f"refused ({refused.status} {refused.code}): {_why(refused)}",
                  file=sys.stderr)  # fmt: skip
            return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="controlplane-client")
    commands = parser.add_subparsers(dest="area", required=True)
    evals = commands.add_parser("eval", help="eval suites")
    actions = evals.add_subparsers(dest="action", required=True)
    run = actions.add_parser(
        "run", help="run a suite through an agent command and gate on the result"
    )
    run.add_argument("suite", help="the suite's slug")
    run.add_argument(
        "--agent-cmd", required=True,
        help="the agent command: reads the case input on stdin, prints its answer",
    )  # fmt: skip
    run.add_argument(
        "--agent",
        help="the name the eval runs go by (for --baseline LAST); default: the "
        "command's program name",
    )
    run.add_argument("--k", type=int, default=5, help="trials per case")
    run.add_argument("--gate", help='e.g. "pass^k>=0.8 and cost<=0.05"')
    run.add_argument("--baseline", help="LAST or an eval run id")
    run.add_argument("--junit", help="write JUnit XML to this file")
    run.add_argument(
        "--trial-timeout", type=float, default=600.0,
        help="seconds one agent command may take",
    )  # fmt: skip
    return parser


def agent_name_of(command: list[str]) -> str:
    """`python agents/refund_agent.py --x` -> `refund_agent`."""
    program = command[0]
    if Path(program).name.startswith("python") and len(command) > 1:
        rest = [part for part in command[1:] if not part.startswith("-")]
        program = rest[0] if rest else program
    stem = Path(program).stem or "agent"
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in stem)
    return cleaned.lstrip("._-")[:64] or "agent"


def _eval_run(
    client: ControlPlaneClient,
    options: argparse.Namespace,
    command: list[str],
    out: TextIO,
) -> int:
    agent = options.agent or agent_name_of(command)
    eval_run = client.start_eval_run(
        suite=options.suite, external_agent=agent, k=options.k,
        gate=options.gate, baseline=options.baseline,
    )  # fmt: skip
    trials = [(case, trial) for case in eval_run["cases"] for trial in case["trials"]]
    print(f"eval run {eval_run['id']}: suite {options.suite}, external agent "
          f"{agent}, k={eval_run['k']}", file=out, flush=True)  # fmt: skip
    passed = 0
    for done, (case, trial) in enumerate(trials, start=1):
        graded = _trial(client, eval_run["id"], case, trial, command, options)
        passed += bool(graded.get("passed"))
        print(f"trials {done}/{len(trials)}  passed {passed}  "
              f"({case['case']} #{trial['index']}: "
              f"{'pass' if graded.get('passed') else 'fail'})",
              file=out, flush=True)  # fmt: skip
    _wait_finished(client, eval_run["id"])
    verdict = client.eval_verdict(
        eval_run["id"], gate=options.gate, baseline=options.baseline
    )
    for line in verdict["lines"]:
        print(line, file=out)
    for note in verdict["notes"]:
        print(f"note: {note}", file=out)
    if options.junit:
        Path(options.junit).write_text(verdict["junit"], encoding="utf-8")
        print(f"JUnit XML written to {options.junit}", file=out)
    if verdict["gate"] is not None:
        for clause in verdict["gate"]["clauses"]:
            print(f"gate {clause}", file=out)
    if verdict["regression"] is not None:
        for reason in verdict["regression"]["reasons"]:
            print(f"regression: {reason}", file=out)
        print(verdict["regression"]["message"], file=out)
    print("eval passed" if verdict["passed"] else "eval FAILED", file=out, flush=True)
    return 0 if verdict["passed"] else 1


def _trial(
    client: ControlPlaneClient,
    eval_run_id: str,
    case: dict[str, Any],
    trial: dict[str, Any],
    command: list[str],
    options: argparse.Namespace,
) -> dict[str, Any]:
    """Run the agent once under a fresh trace and report the trial."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    environ = {
        **os.environ,
        TRACEPARENT_ENV: f"00-{trace_id}-{span_id}-01",
        TRACE_ID_ENV: trace_id,
        "CONTROLPLANE_EVAL_RUN": eval_run_id,
        "CONTROLPLANE_EVAL_CASE": case["case"],
        "CONTROLPLANE_EVAL_TRIAL": trial["id"],
    }
    try:
        finished = subprocess.run(
            command, input=case["input"], env=environ, capture_output=True,
            text=True, timeout=options.trial_timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return client.report_trial(
            eval_run_id, trial["id"],
            error=f"the agent did not finish in {options.trial_timeout:g}s",
        )  # fmt: skip
    except OSError as cannot:
        return client.report_trial(
            eval_run_id, trial["id"], error=f"the agent could not start: {cannot}"
        )
    if finished.returncode != 0:
        tail = finished.stderr.strip()[-ERROR_TAIL_CHARS:]
        return client.report_trial(
            eval_run_id, trial["id"],
            error=f"the agent exited {finished.returncode}: {tail}",
        )  # fmt: skip
    deadline = time.monotonic() + SPANS_WAIT_SECONDS
    while True:
        try:
            return client.report_trial(
                eval_run_id, trial["id"], trace_id=trace_id,
                final_answer=finished.stdout.strip(),
            )  # fmt: skip
        except ControlPlaneError as refused:
            if refused.code != "trace_not_found":
                raise
            if time.monotonic() > deadline:
                return client.report_trial(
                    eval_run_id, trial["id"],
                    error=f"no span of trace {trace_id} arrived: the agent must "
                    "send its spans under TRACEPARENT and flush them before it "
                    "exits",
                )  # fmt: skip
            time.sleep(POLL_SECONDS)


def _wait_finished(client: ControlPlaneClient, eval_run_id: str) -> None:
    """Every trial is reported and graded as it is reported; the eval run's
    summary is written by the last report, so this rarely waits."""
    deadline = time.monotonic() + SPANS_WAIT_SECONDS
    while client.get_eval_run(eval_run_id)["status"] == "running":
        if time.monotonic() > deadline:
            raise ControlPlaneError(
                409, "not_finished", "the eval run did not finish", {}
            )
        time.sleep(POLL_SECONDS)


def _why(refused: ControlPlaneError) -> str:
    fields = refused.detail.get("fields") if refused.detail else None
    if isinstance(fields, dict) and fields:
        return "; ".join(
            f"{name}: {_text(problems)}" for name, problems in fields.items()
        )
    return refused.message


def _text(problems: Any) -> str:
    if isinstance(problems, list):
        return " ".join(_text(problem) for problem in problems)
    if isinstance(problems, dict):
        return "; ".join(f"{k}: {_text(v)}" for k, v in problems.items())
    return str(problems)


if __name__ == "__main__":
    sys.exit(main())
