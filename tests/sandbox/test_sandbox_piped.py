"""A long-lived sandboxed process with piped stdin and stdout: talked to while it
runs, stopped whole (also when it ignores the end of its input), killed by the wall
clock whatever its caller does. The autouse fixture checks nothing is left."""

from __future__ import annotations

import os
import select
import time
from pathlib import Path

import pytest

from runs.sandbox import Limits, SandboxSettings, SandboxSpec, SandboxSpecError
from runs.sandbox.piped import open_sandbox_process
from tests.sandbox.conftest import PYTHON

ECHO = (
    "import sys, os\n"
    "for line in sys.stdin:\n"
    "    print(line.strip().upper(), os.getuid(), flush=True)\n"
)


def read_line(fd: int, timeout: float = 10.0, lines: int = 1) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while data.count(b"\n") < lines:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no line within {timeout}s (got {data!r})"
        chunk = os.read(fd, 4096)
        assert chunk, f"end of output (got {data!r})"
        data += chunk
    return data


def spec(workspace: Path, code: str, *, wall: float = 20.0) -> SandboxSpec:
    return SandboxSpec(
        argv=[PYTHON, "-c", code],
        workspace=workspace,
        limits=Limits(wall_seconds=wall, cpu_seconds=10, memory_mb=128, pids=16),
    )


def test_a_piped_process_answers_line_by_line_and_ends_with_its_input(
    settings: SandboxSettings, workspace: Path
):
    process = open_sandbox_process(spec(workspace, ECHO), settings)
    for word in (b"kettle", b"spout"):
        os.write(process.stdin, word + b"\n")
        assert read_line(process.stdout) == word.upper() + b" 65534\n"
    result = process.stop(grace_seconds=5)
    assert result is not None
    assert result.termination_cause == "exit" and result.exit_code == 0
    assert result.enforcement["netns"] is True and result.reap_confirmed


def test_a_process_that_ignores_the_end_of_its_input_is_killed_whole(
    settings: SandboxSettings, workspace: Path
):
    code = (
        "import subprocess, time\nsubprocess.Popen(['sleep', '300'])\ntime.sleep(300)\n"
    )
    process = open_sandbox_process(spec(workspace, code), settings)
    started = time.monotonic()
    result = process.stop(grace_seconds=0.5)
    assert time.monotonic() - started < 10
    assert result is not None and result.termination_cause == "signal"
    assert result.reap_confirmed


def test_the_wall_clock_ends_a_session_nobody_stops(
    settings: SandboxSettings, workspace: Path
):
    process = open_sandbox_process(spec(workspace, ECHO, wall=1.0), settings)
    deadline = time.monotonic() + 10
    while process.running:
        assert time.monotonic() < deadline, "the wall clock did not end it"
        time.sleep(0.05)
    result = process.stop()
    assert result is not None and result.termination_cause == "wall_clock"


def test_a_piped_process_takes_no_stdin_data(
    settings: SandboxSettings, workspace: Path
):
    bad = SandboxSpec(argv=[PYTHON, "-c", "1"], workspace=workspace, stdin_data=b"x")
    with pytest.raises(SandboxSpecError, match="stdin_data"):
        open_sandbox_process(bad, settings)


def test_readonly_paths_are_visible_and_not_writable(
    settings: SandboxSettings, workspace: Path
):
    # Beside the workspaces: a directory the sandbox uid may traverse.
    shared = settings.workspace_root.parent / "shared-readonly"
    shared.mkdir(exist_ok=True)
    (shared / "new.txt").unlink(missing_ok=True)
    (shared / "hello.txt").write_text("from the host")
    os.chmod(shared, 0o755)
    os.chmod(shared / "hello.txt", 0o644)
    code = (
        f"print(open('{shared}/hello.txt').read(), flush=True)\n"
        "try:\n"
        f"    open('{shared}/new.txt', 'w')\n"
        "    print('wrote', flush=True)\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno, flush=True)\n"
    )
    piped = SandboxSpec(
        argv=[PYTHON, "-c", code],
        workspace=workspace,
        limits=Limits(wall_seconds=20, cpu_seconds=10, memory_mb=128, pids=16),
        readonly_paths=[str(shared)],
    )
    process = open_sandbox_process(piped, settings)
    assert read_line(process.stdout, lines=2) == b"from the host\nrefused 30\n"
    process.stop()
    assert not (shared / "new.txt").exists()
