"""The leak check counts this session's sandboxes only, not other sessions' on the
same host (another checkout's tests, a running `make run`), which use uid 65534 too."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runs.sandbox.cgroup import CgroupLayout

from .conftest import GROUP_PREFIX, SESSION_GROUP, sandbox_processes, session_cgroups

DROP = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _v2_group(group: str) -> Path:
    layout = CgroupLayout.detect()
    assert layout.v2_root is not None, "the tests need a cgroup2 hierarchy"
    return layout.v2_root / group


@contextlib.contextmanager
def _run_cgroup(group: str) -> Iterator[Path]:
    """A run cgroup in `group`'s cgroup2 directory, removed afterwards."""
    base = _v2_group(group)
    made_base = not base.exists()
    base.mkdir(exist_ok=True)
    run = base / f"leak-check-{secrets.token_hex(4)}"
    run.mkdir()
    try:
        yield run
    finally:
        deadline = time.monotonic() + 5
        while (run / "cgroup.procs").read_text().strip():
            assert time.monotonic() < deadline, "a probe process survived"
            time.sleep(0.01)
        run.rmdir()
        if made_base:
            base.rmdir()


def _orphan(cgroup: Path | None = None) -> int:
    """A uid-65534 `sleep` whose parent has exited (re-parented to the host's
    init): not a descendant of this process; in `cgroup` if given."""
    join = f"echo $$ > {cgroup / 'cgroup.procs'}; " if cgroup is not None else ""
    inner = f"{join}exec setsid {' '.join(DROP)} sleep 30"
    proc = subprocess.run(
        ["sh", "-c", f"sh -c '{inner}' </dev/null >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(proc.stdout)
    deadline = time.monotonic() + 5
    while not _runs_as_sandbox_uid(pid):
        assert time.monotonic() < deadline, "the probe never dropped to uid 65534"
        time.sleep(0.01)
    return pid


def _runs_as_sandbox_uid(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    uid = next(line for line in status.splitlines() if line.startswith("Uid:"))
    return uid.split()[1] == "65534" and "sleep" in status.splitlines()[0]


def _listed(pid: int) -> bool:
    return any(line.startswith(f"{pid}:") for line in sandbox_processes())


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while _runs_as_sandbox_uid(pid):
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.fixture
def other_session_group() -> str:
    # Named like no live session (and like no dead one: the sweep ignores it).
    return f"{GROUP_PREFIX}other-{secrets.token_hex(4)}"


def test_another_sessions_sandbox_process_is_not_counted(
    other_session_group: str,
) -> None:
    with _run_cgroup(other_session_group) as theirs:
        pid = _orphan(theirs)
        try:
            assert not _listed(pid)
            assert theirs not in session_cgroups()
        finally:
            _kill(pid)
    stray = _orphan()  # a uid-65534 process in no sandbox cgroup at all
    try:
        assert not _listed(stray)
    finally:
        _kill(stray)


def test_this_sessions_sandbox_processes_are_counted() -> None:
    child = subprocess.Popen([*DROP, "sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while not _runs_as_sandbox_uid(child.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert _listed(child.pid)  # a descendant of this pytest process
    finally:
        child.kill()
        child.wait()
    # One that outlived its runner: no longer a descendant, still in a cgroup of
    # this session's group.
    with _run_cgroup(SESSION_GROUP) as ours:
        pid = _orphan(ours)
        try:
            assert _listed(pid)
            assert ours in session_cgroups()
        finally:
            _kill(pid)
