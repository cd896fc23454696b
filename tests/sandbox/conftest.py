"""Fixtures for the sandbox tests: real bubblewrap, real cgroups, real processes.

Every test is followed by a leak check: no cgroup of this test process and no process
running as the sandbox uid may remain.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from runs.sandbox import (
    Limits,
    SandboxResult,
    SandboxSettings,
    SandboxSpec,
    release_spares,
    run_in_sandbox,
    wait_for_teardown,
    workspace_create,
    workspace_release,
)
from runs.sandbox.cgroup import CgroupLayout
from runs.sandbox.ownership import owner_tag

TEST_ROOT = Path("/var/lib/agent-sandbox-test")
SANDBOX_UID = 65534
PYTHON = "/usr/bin/python3"  # world-executable; a pyenv under /root is not (§6.3 #5)


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
def settings() -> SandboxSettings:
    TEST_ROOT.mkdir(exist_ok=True)
    os.chmod(TEST_ROOT, 0o711)
    return SandboxSettings(
        workspace_root=TEST_ROOT / "workspaces",
        state_dir=TEST_ROOT / "state",
        cgroup_group="agent-sandbox-test",
    )


@pytest.fixture
def workspace(settings: SandboxSettings) -> Iterator[Path]:
    path = workspace_create(settings=settings, label="t")
    yield path
    workspace_release(path, settings=settings)


def sandbox_cgroups(group: str) -> list[Path]:
    tag = owner_tag()
    found: list[Path] = []
    for base in CgroupLayout.detect().group_dirs(group):
        if base.is_dir():
            found += [
                p for p in base.iterdir() if p.is_dir() and p.name.startswith(tag)
            ]
    return found


def sandbox_processes() -> list[str]:
    """Processes running as the sandbox uid (nothing else on a test host uses it)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:") and int(line.split()[1]) == SANDBOX_UID:
                found.append(f"{entry}: {status.splitlines()[0]}")
    return found


@pytest.fixture(autouse=True)
def _no_sandbox_left_behind(settings: SandboxSettings) -> Iterator[None]:
    yield
    # The removal of a finished run's cgroups, mount and run directory happens
    # after its result is returned, and the next run's empty directories are made
    # then: wait for that (boundedly), remove those spares, then check.
    assert wait_for_teardown(10.0)
    release_spares()
    assert sandbox_cgroups(settings.cgroup_group) == []
    assert sandbox_processes() == []
    runs = settings.state_dir / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []
    assert sandbox_mounts(settings) == []


def sandbox_mounts(settings: SandboxSettings) -> list[str]:
    """Mount points (the runs' /tmp tmpfs) under the state directory."""
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    points = [line.split()[4] for line in mountinfo]
    return [p for p in points if p.startswith(str(settings.state_dir))]


def run_python(
    settings: SandboxSettings, workspace: Path, code: str, limits: Limits | None = None
) -> SandboxResult:
    """Run a Python snippet with the system interpreter inside the sandbox."""
    spec = SandboxSpec(
        argv=[PYTHON, "-c", code], workspace=workspace, limits=limits or Limits()
    )
    return run_in_sandbox(spec, settings)
