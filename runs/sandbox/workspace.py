"""Per-run workspaces created by the runner, with an owner record for the janitor.

The owner record lives in the state directory, not in the workspace, because the
workspace is writable by the sandbox and a workload must not be able to rewrite who
owns it.
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
    name = f"{label}-{run_name()}"
    path = root / name
    path.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(path, settings.sandbox_uid, settings.sandbox_gid)
    records = _records_dir(settings)
    records.mkdir(parents=True, exist_ok=True)
    os.chmod(records, 0o700)
    pid = os.getpid()
    record = {"path": str(path), "pid": pid, "start": process_start_time(pid) or 0}
    (records / f"{name}.json").write_text(json.dumps(record))
    return path


def workspace_release(path: Path | str, *, settings: SandboxSettings) -> None:
    """Delete a workspace made by workspace_create, and its owner record."""
    path = Path(path)
    root = Path(os.path.realpath(settings.workspace_root))
    if root not in Path(os.path.realpath(path)).parents:
        raise SandboxSpecError(f"{path} is not beneath {root}")
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (_records_dir(settings) / f"{path.name}.json").unlink()
