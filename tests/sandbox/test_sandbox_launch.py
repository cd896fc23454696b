"""The launcher (sandbox_launch.c): the sandbox is born inside its cgroups, with the
identity setpriv would give it, and nothing runs if it cannot get there."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from runs.sandbox import (
    SandboxResult,
    SandboxSettings,
    SandboxSpec,
    SandboxUnavailable,
    run_in_sandbox,
)
from runs.sandbox import runner as sandbox_runner
from runs.sandbox.cgroup import RunCgroup

from .conftest import PYTHON, sandbox_cgroups, sandbox_processes


def _while_running(
    settings: SandboxSettings, workspace: Path, wanted: int
) -> tuple[dict[int, str], list[Path], SandboxResult]:
    """Run a sleeping workload; return /proc/PID/status of the sandbox's processes
    and its cgroup directories as seen while it runs, and the result."""
    spec = SandboxSpec(
        argv=[PYTHON, "-c", "import time; time.sleep(1)"], workspace=workspace
    )
    results: list[SandboxResult] = []
    worker = threading.Thread(
        target=lambda: results.append(run_in_sandbox(spec, settings))
    )
    worker.start()
    statuses: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 5
        while len(sandbox_processes()) < wanted and time.monotonic() < deadline:
            time.sleep(0.02)
        for line in sandbox_processes():
            pid = int(line.split(":")[0])
            statuses[pid] = Path(f"/proc/{pid}/status").read_text()
        dirs = sandbox_cgroups(settings.cgroup_group)
        listed = {d: (d / "cgroup.procs").read_text() for d in dirs}
    finally:
        worker.join()
    for d, procs in listed.items():
        assert set(statuses) <= {int(x) for x in procs.split()}, d
    return statuses, dirs, results[0]


def test_the_sandbox_is_born_inside_its_cgroups(
    settings: SandboxSettings, workspace: Path
) -> None:
    # bubblewrap makes the cgroup namespace when it forks the init: its root is the
    # cgroup bubblewrap was in at that moment. "/" inside, for every hierarchy the
    # run has, means bubblewrap was already in the run's cgroups (on the host they
    # are the run's directories, test_every_sandbox_process_is_inside_...).
    spec = SandboxSpec(argv=["cat", "/proc/self/cgroup"], workspace=workspace)
    r = run_in_sandbox(spec, settings)
    assert r.ok, r.detail
    paths = {
        line.split(":")[1]: line.split(":", 2)[2]
        for line in r.stdout.splitlines()
        if line.count(":") >= 2
    }
    for hierarchy in ("pids", "memory", "cpu", ""):  # "": the cgroup2 line
        assert paths[hierarchy] == "/", (hierarchy, r.stdout)
    assert r.counters["pids_peak"] == 3  # bwrap, the init and the workload


def test_the_launcher_drops_to_the_setpriv_identity(
    settings: SandboxSettings, workspace: Path
) -> None:
    # Seen from the host: bubblewrap itself (outside its user namespace) runs as the
    # sandbox uid/gid with no groups, no capabilities and no_new_privs, which is
    # what `setpriv --reuid --regid --clear-groups --no-new-privs --inh-caps=-all`
    # gave it before the launcher did the drop itself.
    statuses, _dirs, result = _while_running(settings, workspace, wanted=3)
    bwrap = [s for s in statuses.values() if s.startswith("Name:\tbwrap")]
    assert bwrap and result.ok
    for status in bwrap:
        fields = dict(line.split(":", 1) for line in status.splitlines())
        assert fields["Uid"].split() == ["65534"] * 4
        assert fields["Gid"].split() == ["65534"] * 4
        assert fields["Groups"].split() == []
        for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
            assert int(fields[cap], 16) == 0, cap
        assert fields["NoNewPrivs"].strip() == "1"


def test_a_launcher_that_cannot_join_runs_nothing(
    settings: SandboxSettings, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = RunCgroup.__dict__["tasks_files"]

    def broken(self: RunCgroup) -> list[str]:
        return [*real.fget(self), "/sys/fs/cgroup/pids/no-such-group/tasks"]

    monkeypatch.setattr(RunCgroup, "tasks_files", property(broken))
    spec = SandboxSpec(
        argv=["sh", "-c", "echo ran > /workspace/ran.txt"], workspace=workspace
    )
    with pytest.raises(SandboxUnavailable) as info:
        run_in_sandbox(spec, settings)
    assert info.value.missing == ["cgroup"] and "no-such-group" in str(info.value)
    assert not (workspace / "ran.txt").exists()


def test_without_the_launcher_the_runner_joins_the_cgroups_itself(
    settings: SandboxSettings, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No C compiler: no launcher; setpriv drops the uid and the runner moves the
    # starting sandbox into the cgroups before it releases the init.
    monkeypatch.setattr(sandbox_runner, "install_launcher", lambda settings: None)
    # _while_running checks that each run cgroup lists every sandbox process.
    statuses, dirs, result = _while_running(settings, workspace, wanted=3)
    assert result.ok and len(dirs) == 4 and len(statuses) >= 3
    assert result.enforcement["pids_limit"] and result.enforcement["memory_limit"]
