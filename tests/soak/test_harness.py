"""`make soak`'s harness, run for real but small: the production topology (its own
PostgreSQL cluster and Redis, Daphne, three workers, beat) comes up, two demo runs
with approvals and a WebSocket client pass every check, and everything it started
is gone afterwards, also after Ctrl-C. The fault phases take minutes: they run in
`make soak`, not here."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from soak.topology import tagged_processes

BASE_DIR = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.soak


@pytest.fixture(autouse=True)
def harnesses() -> Iterator[list[subprocess.Popen[str]]]:
    """Every harness a test started is gone after it, even when the test failed
    (its own Ctrl-C handling is what is under test, so SIGINT first)."""
    yield STARTED
    for process in STARTED:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    STARTED.clear()


STARTED: list[subprocess.Popen[str]] = []


def harness(*args: str) -> subprocess.Popen[str]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "CELERY_QUEUE"}
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "soak", *args],
        cwd=BASE_DIR,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    STARTED.append(process)
    return process


def started_topology(output: str) -> tuple[str, str]:
    found = re.search(r"working directory (\S+) \(run id (\w+)\)", output)
    assert found, output
    return found.group(1), found.group(2)


def assert_cleaned_up(output: str) -> None:
    workdir, run_id = started_topology(output)
    assert "stopped every process and removed the working directory" in output, output
    # The PostgreSQL cluster (and Redis's directory, the logs) lived there.
    assert not Path(workdir).exists()
    assert tagged_processes(run_id, workdir) == []


def test_two_runs_without_a_fault_meet_every_target_and_leave_nothing() -> None:
    """One run approved (it must succeed with one replacement), one denied (it
    must fail with none), a WebSocket client on the first."""
    process = harness(
        "--runs-per-fault", "2", "--deny-every", "2", "--clients", "1",
        "--faults", "none",
    )  # fmt: skip
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    row = r"^\| none +\| +2 \| +0 \| +0 \| +0 \| +0/1 \| +- \| +0 \|$"
    assert re.search(row, output, re.MULTILINE), output
    assert "every target met" in output
    assert_cleaned_up(output)


def test_ctrl_c_stops_everything_it_started() -> None:
    process = harness(
        "--runs-per-fault", "50", "--rate", "1", "--clients", "2", "--faults", "none"
    )
    assert process.stdout is not None
    lines = []
    deadline = time.monotonic() + 240
    for line in process.stdout:  # until runs are being driven
        lines.append(line)
        if "phase none:" in line or time.monotonic() > deadline:
            break
    time.sleep(3)  # runs, approvals and a WebSocket client in flight
    workdir, run_id = started_topology("".join(lines))
    assert (
        len(tagged_processes(run_id, workdir)) >= 8
    )  # pg, redis, web, 3+ workers, beat
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=120)
    output = "".join(lines) + rest
    assert process.returncode == 130, output
    assert "interrupted; stopping what it started" in output
    assert_cleaned_up(output)


def test_an_unknown_fault_is_refused_by_name_before_anything_starts() -> None:
    process = harness("--faults", "worker-kill,disk-full")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "unknown fault(s) disk-full" in output
    assert "worker-kill, child-kill, redis-restart" in output
    assert "working directory" not in output
