"""Teardown after the result and the next run's directories made ahead (spare.py):
a prepared run still gets its own limits, /tmp size and an empty cgroup."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from runs.sandbox import (
    Limits,
    SandboxResult,
    SandboxSettings,
    SandboxSpec,
    release_spares,
    run_in_sandbox,
    wait_for_teardown,
)

from .conftest import PYTHON, sandbox_cgroups, sandbox_processes

PROBE = """
import os, time
st = os.statvfs("/tmp")
print(st.f_blocks * st.f_frsize, flush=True)
time.sleep(0.3)
for _ in range(20):
    if os.fork() == 0:
        time.sleep(5)
        os._exit(0)
"""


def _names(settings: SandboxSettings) -> set[str]:
    return {d.name for d in sandbox_cgroups(settings.cgroup_group)}


def test_a_prepared_run_gets_its_own_limits(
    settings: SandboxSettings, workspace: Path
) -> None:
    assert run_in_sandbox(SandboxSpec(argv=["true"], workspace=workspace), settings).ok
    assert wait_for_teardown(10.0)
    # The last run's directories are gone; one empty set is ready for the next.
    (spare,) = _names(settings)
    assert (settings.state_dir / "runs" / spare / "tmp").is_dir()
    assert sandbox_processes() == []
    spec = SandboxSpec(
        argv=[PYTHON, "-c", PROBE],
        workspace=workspace,
        limits=Limits(pids=8, tmpfs_mb=8),
    )
    results: list[SandboxResult] = []
    worker = threading.Thread(
        target=lambda: results.append(run_in_sandbox(spec, settings))
    )
    worker.start()
    try:
        deadline = time.monotonic() + 5
        while not sandbox_processes() and time.monotonic() < deadline:
            time.sleep(0.01)
        during = _names(settings)
    finally:
        worker.join()
    assert during == {spare}  # the run used the prepared directories
    r = results[0]
    assert int(r.stdout.split()[0]) == 8 * 1024 * 1024  # this run's /tmp size
    # This run's pids.max (8: bwrap, init, the workload and 5 children).
    assert r.termination_cause == "pids_limit" and r.reap_confirmed
    assert r.counters["pids_max_events"] > 0 and r.counters["pids_peak"] == 8
    assert r.enforcement["pids_limit"] and r.enforcement["memory_limit"]
    assert wait_for_teardown(10.0)
    after = _names(settings)
    assert len(after) == 1 and spare not in after
    release_spares()
    assert _names(settings) == set()
    assert list((settings.state_dir / "runs").iterdir()) == []
