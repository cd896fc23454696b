"""Fixtures for the sandbox tests: real bubblewrap, real cgroups, real processes.

Every test is followed by a leak check: no cgroup, run directory, mount or sandbox-uid
process of this test session may remain. Other sessions on the same host (another
checkout's `make test`, a running `make run`) use uid 65534 too; the check counts only
what belongs to this session: its own cgroup group and state directory (named after
this pytest process), and the processes in them or descended from it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from runs.sandbox import (
    Limits,
    SandboxResult,
    SandboxSettings,
    SandboxSpec,
    release_spares,
    run_in_sandbox,
    sandbox_janitor_sweep,
    wait_for_teardown,
    workspace_create,
    workspace_release,
)
from runs.sandbox.cgroup import CgroupLayout
from runs.sandbox.ownership import owner_alive, owner_tag

TEST_ROOT = Path("/var/lib/agent-sandbox-test")
SANDBOX_UID = 65534
PYTHON = "/usr/bin/python3"  # world-executable; a pyenv under /root is not (§6.3 #5)
# This session: `r<pid>-<start time>` of the pytest process. Its cgroup group and
# state directory carry it, so whatever runs in them is this session's.
SESSION = owner_tag()
GROUP_PREFIX = "agent-sandbox-test-"
SESSION_GROUP = f"{GROUP_PREFIX}{SESSION}"
SESSIONS_DIR = TEST_ROOT / "sessions"


@pytest.fixture(scope="session", autouse=True)
def _host_can_sandbox() -> None:
    if shutil.which("bwrap") is None:
        pytest.fail(
            "bubblewrap is not installed: apt-get install bubblewrap", pytrace=False
        )
    if os.geteuid() != 0:
        pytest.fail("the sandbox tests need root (cgroups, uid drop)", pytrace=False)
    if not os.access(PYTHON, os.X_OK):
        pytest.fail(f"{PYTHON} is missing: apt-get install python3", pytrace=False)


@pytest.fixture(scope="session")
def settings() -> Iterator[SandboxSettings]:
    TEST_ROOT.mkdir(exist_ok=True)
    os.chmod(TEST_ROOT, 0o711)
    base = SandboxSettings(
        workspace_root=TEST_ROOT / "workspaces",
        state_dir=SESSIONS_DIR / SESSION,
        cgroup_group=SESSION_GROUP,
    )
    _sweep_dead_sessions(base)
    yield base
    release_spares()
    _remove_session(base)


def _sweep_dead_sessions(settings: SandboxSettings) -> None:
    """What a killed earlier session left (its janitor never ran): sweep it."""
    names = {p.name for p in SESSIONS_DIR.iterdir()} if SESSIONS_DIR.is_dir() else set()
    for base in CgroupLayout.detect().group_dirs(SESSION_GROUP):
        if base.parent.is_dir():
            names |= {
                p.name.removeprefix(GROUP_PREFIX)
                for p in base.parent.iterdir()
                if p.name.startswith(GROUP_PREFIX)
            }
    for name in names:
        pid, _, start = name.removeprefix("r").partition("-")
        if not (pid.isdigit() and start.isdigit()) or owner_alive(int(pid), int(start)):
            continue
        dead = replace(
            settings,
            state_dir=SESSIONS_DIR / name,
            cgroup_group=f"{GROUP_PREFIX}{name}",
        )
        sandbox_janitor_sweep(dead)
        _remove_session(dead)


def _remove_session(settings: SandboxSettings) -> None:
    """The session's (empty) cgroup group directories and its state directory."""
    for base in CgroupLayout.detect().group_dirs(settings.cgroup_group):
        with contextlib.suppress(OSError):
            base.rmdir()
    shutil.rmtree(settings.state_dir, ignore_errors=True)


@pytest.fixture
def workspace(settings: SandboxSettings) -> Iterator[Path]:
    path = workspace_create(settings=settings, label="t")
    yield path
    workspace_release(path, settings=settings)


def sandbox_cgroups(group: str) -> list[Path]:
    """The run cgroups of `group` made by this process (its owner tag)."""
    tag = owner_tag()
    return [p for p in session_cgroups(group) if p.name.startswith(tag)]


def session_cgroups(group: str = SESSION_GROUP) -> list[Path]:
    """Every run cgroup in `group` (this session's: whoever made it)."""
    found: list[Path] = []
    for base in CgroupLayout.detect().group_dirs(group):
        if base.is_dir():
            found += [p for p in base.iterdir() if p.is_dir()]
    return found


def sandbox_processes() -> list[str]:
    """Processes of this session running as the sandbox uid: those in a cgroup of
    the session's group (a sandbox that outlived its runner stays there), and
    those descended from this pytest process (a sandbox without cgroups). Other
    sessions' sandboxes on the same host are not counted."""
    mine = _descendants(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cgroups = Path(f"/proc/{entry}/cgroup").read_text()
        except OSError:
            continue
        uid = next(
            (
                int(line.split()[1])
                for line in status.splitlines()
                if line.startswith("Uid:")
            ),
            None,
        )
        if uid != SANDBOX_UID:
            continue
        in_session = any(
            f"/{SESSION_GROUP}/" in line.partition(":")[2].partition(":")[2] + "/"
            for line in cgroups.splitlines()
        )
        if in_session or int(entry) in mine:
            found.append(f"{entry}: {status.splitlines()[0]}")
    return found


def _descendants(root: int) -> set[int]:
    """`root` and every process below it (by parent pid), at this moment."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found = {root}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


@pytest.fixture(autouse=True)
def _no_sandbox_left_behind(settings: SandboxSettings) -> Iterator[None]:
    yield
    # The removal of a finished run's cgroups, mount and run directory happens
    # after its result is returned, and the next run's empty directories are made
    # then: wait for that (boundedly), remove those spares, then check.
    assert wait_for_teardown(10.0)
    release_spares()
    assert session_cgroups(settings.cgroup_group) == []
    assert sandbox_processes() == []
    runs = settings.state_dir / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []
    assert sandbox_mounts(settings) == []


def sandbox_mounts(settings: SandboxSettings) -> list[str]:
    """Mount points of this session: the runs' /tmp and /dev/shm tmpfs under its
    state directory, and its workspaces' tmpfs."""
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    points = [line.split()[4] for line in mountinfo]
    workspaces = str(settings.workspace_root) + "/"
    return [
        p
        for p in points
        if p.startswith(str(settings.state_dir) + "/")
        or (p.startswith(workspaces) and SESSION in p)
    ]


def run_python(
    settings: SandboxSettings, workspace: Path, code: str, limits: Limits | None = None
) -> SandboxResult:
    """Run a Python snippet with the system interpreter inside the sandbox."""
    spec = SandboxSpec(
        argv=[PYTHON, "-c", code], workspace=workspace, limits=limits or Limits()
    )
    return run_in_sandbox(spec, settings)
