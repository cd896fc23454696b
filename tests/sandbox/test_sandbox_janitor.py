"""Janitor: sandboxes whose owner is gone are killed and removed; live ones are not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from runs.sandbox import (
    SandboxResult,
    SandboxSettings,
    SandboxSpec,
    run_in_sandbox,
    sandbox_janitor_sweep,
)
from runs.sandbox.cgroup import CgroupLayout

from .conftest import sandbox_mounts, sandbox_processes

ROOT = Path(__file__).resolve().parents[2]

OWNER = """
import sys
from pathlib import Path
from runs.sandbox import SandboxSettings, SandboxSpec, run_in_sandbox, workspace_create
settings = SandboxSettings(
    workspace_root=Path(sys.argv[1]),
    state_dir=Path(sys.argv[2]),
    cgroup_group=sys.argv[3],
)
ws = workspace_create(settings=settings, label="owner")
print(ws, flush=True)
run_in_sandbox(SandboxSpec(argv=["sleep", "60"], workspace=ws), settings)
"""


def _group_dirs(settings: SandboxSettings, prefix: str) -> list[Path]:
    found: list[Path] = []
    for base in CgroupLayout.detect().group_dirs(settings.cgroup_group):
        if base.is_dir():
            found += [p for p in base.iterdir() if p.name.startswith(prefix)]
    return found


def test_sweep_removes_sandboxes_of_a_killed_owner(settings: SandboxSettings) -> None:
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            OWNER,
            str(settings.workspace_root),
            str(settings.state_dir),
            settings.cgroup_group,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    ws = Path(owner.stdout.readline().strip())
    prefix = f"r{owner.pid}-"
    deadline = time.monotonic() + 10
    while len(_group_dirs(settings, prefix)) < 2 or not sandbox_processes():
        assert time.monotonic() < deadline, "owner never started its sandbox"
        time.sleep(0.02)
    os.kill(owner.pid, signal.SIGKILL)  # what a Celery hard time limit does
    owner.wait()
    assert _group_dirs(settings, prefix)  # left behind by the dead owner
    assert sandbox_mounts(settings)  # and its /tmp tmpfs
    report = sandbox_janitor_sweep(settings)
    assert report.failed_cgroups == []
    assert _group_dirs(settings, prefix) == []
    assert str(ws) in report.removed_workspaces and not ws.exists()
    assert any(prefix in d for d in report.removed_run_dirs)
    assert sandbox_mounts(settings) == []
    deadline = time.monotonic() + 2
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sandbox_processes() == []


def test_sweep_kills_a_process_left_in_an_orphaned_cgroup(
    settings: SandboxSettings,
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"r{dead.pid}-1-feedbeef"
    layout = CgroupLayout.detect()
    dirs = [base / name for base in layout.group_dirs(settings.cgroup_group)]
    for d in dirs:
        d.parent.mkdir(exist_ok=True)
        d.mkdir()
    procs = " ".join(str(d / "cgroup.procs") for d in dirs)
    stray = subprocess.Popen(
        [
            "sh",
            "-c",
            f'for p in {procs}; do echo $$ > "$p"; done; exec setpriv '
            "--reuid=65534 --regid=65534 --clear-groups sleep 60",
        ],
        start_new_session=True,
    )
    deadline = time.monotonic() + 5
    while not sandbox_processes():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    report = sandbox_janitor_sweep(settings)
    stray.wait(timeout=5)
    assert stray.returncode == -signal.SIGKILL
    assert all(str(d) in report.removed_cgroups for d in dirs)
    assert not any(d.exists() for d in dirs)


def test_sweep_leaves_a_live_owner_alone(
    settings: SandboxSettings, workspace: Path
) -> None:
    results: list[SandboxResult] = []
    spec = SandboxSpec(argv=["sh", "-c", "sleep 0.6; echo done"], workspace=workspace)
    worker = threading.Thread(
        target=lambda: results.append(run_in_sandbox(spec, settings))
    )
    worker.start()
    time.sleep(0.3)
    report = sandbox_janitor_sweep(settings)
    worker.join()
    assert report.removed_cgroups == [] and report.removed_run_dirs == []
    assert results[0].ok and results[0].stdout == "done\n"
