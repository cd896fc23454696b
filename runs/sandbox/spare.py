"""The next run's directories, made ahead of time on the teardown thread.

Making a run's four cgroup directories (a memory cgroup allocates per-CPU state)
and its run directory with the /tmp mount point costs ~0.8 ms here. After the
teardown thread has removed a finished run's directories, it makes one empty set
for the next run of the same settings, so a caller usually finds it ready and only
writes its limits into it and mounts its /tmp.

A spare is empty directories: no process, no mount, no limit; nothing of a workload
is started before a caller asks. Its name carries the owner like any run's
(`r<pid>-<start time>-<token>`), so the janitor removes it if the process dies.
`release_spares()` removes the spares of this process (the tests' leak check, the
benchmark and interpreter exit call it).
"""

from __future__ import annotations

import atexit
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from . import teardown
from .capabilities import HostCapabilities
from .cgroup import RunCgroup
from .ownership import run_name
from .spec import SandboxSettings

_Key = tuple[str, str, str]  # (state_dir, cgroup_group, cgroup_root)


@dataclass
class Spare:
    name: str
    run_dir: Path  # with empty "tmp" and "shm" mount points when bubblewrap works
    cgroup: RunCgroup | None  # directories made, no limit written yet


_lock = threading.Lock()
_spares: dict[_Key, Spare] = {}
_closed = False


def _key(settings: SandboxSettings) -> _Key:
    return (str(settings.state_dir), settings.cgroup_group, str(settings.cgroup_root))


def take(settings: SandboxSettings) -> Spare | None:
    """The prepared directories for a run with `settings`, if there are any."""
    with _lock:
        return _spares.pop(_key(settings), None)


def prepare(settings: SandboxSettings, caps: HostCapabilities) -> None:
    """Make one spare for `settings` unless there is one (teardown thread)."""
    key = _key(settings)
    with _lock:
        if _closed or key in _spares:
            return
    name = run_name()
    run_dir = settings.state_dir / "runs" / name
    run_dir.mkdir(mode=0o711)
    cgroup = None
    try:
        if caps.bwrap_works:
            (run_dir / "tmp").mkdir(mode=0o700)
            (run_dir / "shm").mkdir(mode=0o700)
        if any(caps.cgroup_writable.values()):
            cgroup = RunCgroup.make(caps.cgroup, settings.cgroup_group, name)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    spare = Spare(name, run_dir, cgroup)
    with _lock:
        keep = not _closed and key not in _spares
        if keep:
            _spares[key] = spare
    if not keep:
        _discard(spare)


def release_spares(timeout: float = 10.0) -> None:
    """Remove this process's spares, after any teardown still under way."""
    teardown.wait_for_teardown(timeout)
    with _lock:
        spares = list(_spares.values())
        _spares.clear()
    for spare in spares:
        _discard(spare)


def _discard(spare: Spare) -> None:
    if spare.cgroup is not None:
        spare.cgroup.remove()
    shutil.rmtree(spare.run_dir, ignore_errors=True)


def _at_exit() -> None:
    global _closed
    with _lock:
        _closed = True
    release_spares()


def _after_fork_in_child() -> None:
    # The parent's spares carry the parent's pid: they are not the child's to use.
    global _lock, _spares
    _lock = threading.Lock()
    _spares = {}


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
