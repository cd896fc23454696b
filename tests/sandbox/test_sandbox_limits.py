"""Wall clock, CPU, pids, memory (T-RUN-3, T-ORPH-3, T-RL-1..3, T-FORK-1, T-CG-2)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from runs.sandbox import (
    Limits,
    SandboxResult,
    SandboxSettings,
    SandboxSpec,
    run_in_sandbox,
)

from .conftest import PYTHON, run_python, sandbox_cgroups, sandbox_processes

TREE = """
import os, signal, subprocess, time
# a grandchild in its own session: killpg cannot reach it, cgroup.kill can
subprocess.Popen(["setsid", "sh", "-c", "sleep 1.5; echo late > escaped.txt"])
# a child that ignores SIGTERM
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(1.5)
    open("term_ignorer.txt", "w").write("alive")
    os._exit(0)
print("started", flush=True)
time.sleep(30)
"""


def test_timeout_kills_the_whole_tree(
    settings: SandboxSettings, workspace: Path
) -> None:
    r = run_python(settings, workspace, TREE, Limits(wall_seconds=0.7))
    assert (r.ok, r.exit_code, r.signal, r.timed_out) == (False, None, 9, True)
    assert r.termination_cause == "wall_clock" and r.error == "ETIMEDOUT"
    assert 700 <= r.duration_ms < 2500  # upper bound is generous for a loaded host
    assert r.stdout == "started\n"
    assert r.reap_confirmed and r.enforcement["kill_method"] == "pidns+cgroup.kill"
    assert sandbox_processes() == []
    time.sleep(1.2)  # past the moment the survivors would have written
    assert not (workspace / "escaped.txt").exists()
    assert not (workspace / "term_ignorer.txt").exists()


def test_silent_sleeper_is_killed_on_time(
    settings: SandboxSettings, workspace: Path
) -> None:
    r = run_python(
        settings, workspace, "import time; time.sleep(10)", Limits(wall_seconds=0.5)
    )
    assert r.timed_out and r.signal == 9 and 500 <= r.duration_ms < 2000


def test_cpu_spin_ends_by_sigxcpu_before_wall_clock(
    settings: SandboxSettings, workspace: Path
) -> None:
    limits = Limits(cpu_seconds=1, wall_seconds=10)
    r = run_python(settings, workspace, "while True: pass", limits)
    assert (r.signal, r.signal_name, r.timed_out) == (24, "SIGXCPU", False)
    assert r.termination_cause == "cpu_limit" and r.error == "ECPU"
    # CPU time, not wall time, is what ran out; wall time depends on host load, and
    # rusage reads CPU time a little low under load.
    assert 700 <= r.counters["workload_cpu_ms"] < 1_600
    assert r.duration_ms < 10_000


def test_cpu_spin_ignoring_sigxcpu_dies_at_hard_limit(
    settings: SandboxSettings, workspace: Path
) -> None:
    code = (
        "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass"
    )
    r = run_python(settings, workspace, code, Limits(cpu_seconds=1, wall_seconds=10))
    assert (r.signal, r.timed_out, r.termination_cause) == (9, False, "cpu_limit"), (
        r.counters
    )
    assert 1_200 <= r.counters["workload_cpu_ms"] < 2_600


def test_sleep_under_cpu_limit_completes(
    settings: SandboxSettings, workspace: Path
) -> None:
    r = run_python(
        settings, workspace, "import time; time.sleep(1.5)", Limits(cpu_seconds=1)
    )
    assert r.ok and r.exit_code == 0


def test_fork_bomb_stops_at_pids_limit(
    settings: SandboxSettings, workspace: Path
) -> None:
    # A heartbeat thread in the runner process measures host responsiveness.
    gaps: list[float] = []
    stop = threading.Event()

    def heartbeat() -> None:
        last = time.monotonic()
        while not stop.is_set():
            time.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    beat = threading.Thread(target=heartbeat)
    beat.start()
    code = "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"
    try:
        r = run_python(settings, workspace, code, Limits(pids=32, wall_seconds=10))
    finally:
        stop.set()
        beat.join()
    assert r.termination_cause == "pids_limit" and r.error == "EPIDS"
    assert r.counters["pids_max_events"] > 0
    assert r.counters["pids_peak"] <= 32
    assert not r.timed_out and r.duration_ms < 5000
    assert r.reap_confirmed
    assert max(gaps) < 0.5, f"host stalled for {max(gaps):.3f}s"


def test_memory_hog_ends_with_memory_limit(
    settings: SandboxSettings, workspace: Path
) -> None:
    code = "x = []\nwhile True: x.append(bytearray(8 * 1024 * 1024))"
    r = run_python(settings, workspace, code, Limits(memory_mb=96, wall_seconds=10))
    assert r.termination_cause == "memory_limit" and r.error == "EMEMORY"
    assert r.signal == 9 and r.counters["oom_kill"] >= 1
    assert r.counters["memory_peak_bytes"] <= 96 * 1024 * 1024
    assert r.reap_confirmed


def test_address_space_limit_gives_memoryerror(
    settings: SandboxSettings, workspace: Path
) -> None:
    code = "x = bytearray(600 * 1024 * 1024)"
    r = run_python(settings, workspace, code, Limits(address_space_mb=256))
    assert r.exit_code == 1 and "MemoryError" in r.stderr


def test_cpu_quota_throttles(settings: SandboxSettings, workspace: Path) -> None:
    code = "import time\nend = time.time() + 0.6\nwhile time.time() < end: pass"
    r = run_python(settings, workspace, code, Limits(cpu_quota=0.2))
    assert r.ok and r.counters["cpu_nr_throttled"] > 0  # throttled, never killed


def test_sandbox_env_and_rlimits_reported(
    settings: SandboxSettings, workspace: Path
) -> None:
    spec = SandboxSpec(argv=["true"], workspace=workspace)
    r = run_in_sandbox(spec, settings)
    e = r.enforcement
    for key in ("pidns", "netns", "mountns", "userns", "uid_drop", "no_new_privs"):
        assert e[key] is True, key
    assert e["cgroup"] == "hybrid"
    assert e["cgroup_kill"] and e["memory_limit"] and e["pids_limit"] and e["cpu_quota"]
    assert e["oom_group"] is False  # v1 memory has no group OOM


def test_every_sandbox_process_is_inside_the_run_cgroups(
    settings: SandboxSettings, workspace: Path
) -> None:
    code = "import os, time\nos.fork()\ntime.sleep(1)"  # the workload and a child
    spec = SandboxSpec(argv=[PYTHON, "-c", code], workspace=workspace)
    results: list[SandboxResult] = []
    worker = threading.Thread(
        target=lambda: results.append(run_in_sandbox(spec, settings))
    )
    worker.start()
    try:
        deadline = time.monotonic() + 5
        while len(sandbox_processes()) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)  # bwrap, init, workload and its child
        running = {int(line.split(":")[0]) for line in sandbox_processes()}
        run_dirs = sandbox_cgroups(settings.cgroup_group)
        assert len(run_dirs) == 4 and len(running) >= 4
        for d in run_dirs:
            listed = {int(x) for x in (d / "cgroup.procs").read_text().split()}
            assert running <= listed, d
    finally:
        worker.join()
    assert results[0].ok
