"""Sweep sandboxes whose owner process is gone (start-up and periodic).

A Celery hard time limit kills the worker child that owned a run; its sandbox would
keep running. The sweep kills and removes every sandbox cgroup, run directory and
runner-made workspace whose owner (pid + start time in the name or record) is gone.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .cgroup import CgroupLayout, remove_cgroup_dir
from .ownership import owner_alive, owner_of
from .spec import SandboxSettings
from .tmpfs import unmount_tmpfs
from .workspace import remove_workspace_dir


@dataclass
class JanitorReport:
    removed_cgroups: list[str] = field(default_factory=list)
    failed_cgroups: list[str] = field(default_factory=list)
    removed_run_dirs: list[str] = field(default_factory=list)
    removed_workspaces: list[str] = field(default_factory=list)


def _orphaned(name: str) -> bool:
    owner = owner_of(name)
    return owner is not None and not owner_alive(*owner)


def sandbox_janitor_sweep(settings: SandboxSettings | None = None) -> JanitorReport:
    """Kill and remove sandboxes whose owner is gone; safe to run at any time."""
    settings = settings or SandboxSettings()
    report = JanitorReport()
    layout = CgroupLayout.detect(settings.cgroup_root)
    # v2 first: cgroup.kill takes the whole tree, after which v1 dirs empty out.
    dirs = layout.group_dirs(settings.cgroup_group)
    for base in reversed(dirs):
        if not base.is_dir():
            continue
        for child in sorted(base.iterdir()):
            if child.is_dir() and _orphaned(child.name):
                target = report.removed_cgroups
                if not remove_cgroup_dir(child):
                    target = report.failed_cgroups
                target.append(str(child))
    runs = settings.state_dir / "runs"
    if runs.is_dir():
        for child in runs.iterdir():
            if _orphaned(child.name):
                # Unmount the run's /tmp and /dev/shm first: rmtree would empty
                # them and then fail on the busy mount points.
                unmount_tmpfs(child / "tmp")
                unmount_tmpfs(child / "shm")
                shutil.rmtree(child, ignore_errors=True)
                report.removed_run_dirs.append(str(child))
    records = settings.state_dir / "workspaces"
    if records.is_dir():
        for record in records.glob("*.json"):
            try:
                data = json.loads(record.read_text())
                pid, start, path = (
                    int(data["pid"]),
                    int(data["start"]),
                    Path(data["path"]),
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if owner_alive(pid, start):
                continue
            root = settings.workspace_root.resolve()
            if root in path.resolve().parents:
                remove_workspace_dir(path)
                report.removed_workspaces.append(str(path))
            record.unlink(missing_ok=True)
    return report
