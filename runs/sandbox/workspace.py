"""Per-run workspaces created by the runner, with an owner record for the janitor.

The owner record lives in the state directory, not in the workspace, because the
workspace is writable by the sandbox and a workload must not be able to rewrite who
owns it.

As root, a workspace is its own tmpfs of `settings.workspace_mb` (DK-1): RLIMIT_FSIZE
bounds one file only, and the workspace root's filesystem is the host's. Full, it
gives the workload ENOSPC and the run `EDISK`; nothing reaches the host disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path

from .ownership import process_start_time, run_name
from .spec import SandboxSettings, SandboxSpecError
from .tmpfs import detach, mount_tmpfs

_LABEL = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _records_dir(settings: SandboxSettings) -> Path:
    return settings.state_dir / "workspaces"


def workspace_create(*, settings: SandboxSettings, label: str = "ws") -> Path:
    """Create an empty workspace beneath `settings.workspace_root`, owned by the
    sandbox uid, and record the calling process as its owner."""
    if not _LABEL.match(label):
        raise SandboxSpecError(f"bad workspace label {label!r}")
    root = settings.workspace_root
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)  # the sandbox uid must traverse it for the bind mount
    settings.validate_workspace_mb()
    name = f"{label}-{run_name()}"
    path = root / name
    records = _records_dir(settings)
    records.mkdir(parents=True, exist_ok=True)
    os.chmod(records, 0o700)
    pid = os.getpid()
    record = {"path": str(path), "pid": pid, "start": process_start_time(pid) or 0}
    # The record first: a workspace (and its mount) never exists without one, so
    # the janitor finds it whenever this process dies.
    (records / f"{name}.json").write_text(json.dumps(record))
    try:
        path.mkdir(mode=0o700)
        if os.geteuid() == 0:
            owner = (settings.sandbox_uid, settings.sandbox_gid)
            if settings.workspace_mb is not None:
                mount_tmpfs(
                    path,
                    settings.workspace_mb * 1024 * 1024,
                    make_dir=False,
                    noexec=False,  # programs written there may be run (FS-3)
                    mode=0o700,
                    owner=owner,
                )
            else:
                os.chown(path, *owner)
    except BaseException:
        workspace_release(path, settings=settings)
        raise
    return path


def workspace_release(path: Path | str, *, settings: SandboxSettings) -> None:
    """Delete a workspace made by workspace_create, and its owner record."""
    path = Path(path)
    root = Path(os.path.realpath(settings.workspace_root))
    if root not in Path(os.path.realpath(path)).parents:
        raise SandboxSpecError(f"{path} is not beneath {root}")
    remove_workspace_dir(path)
    with contextlib.suppress(FileNotFoundError):
        (_records_dir(settings) / f"{path.name}.json").unlink()


def remove_workspace_dir(path: Path) -> None:
    """Unmount the workspace's tmpfs (if it is one), then remove the directory."""
    if os.path.ismount(path):  # not without root: nothing to unmount, no right to
        detach(path)
    shutil.rmtree(path, ignore_errors=True)


def workspace_size(path: Path) -> int | None:
    """Bytes the workspace can hold in total when it is a filesystem of its own
    (its own mount, e.g. workspace_create's tmpfs); None when it shares its
    parent's filesystem, where only RLIMIT_FSIZE (per file) bounds writes."""
    try:
        if os.stat(path).st_dev == os.stat(path.parent).st_dev:
            return None
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize
