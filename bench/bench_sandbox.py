"""Benchmark the sandbox runner: `true` 200 times three ways, then 20 at once.

    python bench/bench_sandbox.py [--runs N] [--concurrent N]

1. plain `subprocess.run(["true"])`;
2. raw bubblewrap with the runner's exact flags (and its setpriv uid drop), running
   `true` directly: no cgroup, no init, no bookkeeping;
3. `run_in_sandbox` (launcher, cgroup setup, bubblewrap, the init, wall clock,
   judging), timed until its result is returned; the removal of the run's empty
   cgroups, /tmp mount and run directory, and the making of the next run's empty
   directories, happen after that on a background thread (runs/sandbox/teardown.py,
   spare.py), waited for outside the timed region so they do not overlap the other
   ways' samples. The row `…+teardown` times the same calls until that background
   work has finished too;
4. for reference, bubblewrap starting an empty `python3 -S`: the floor any Python
   init pays.

The three are interleaved so that drift on a shared VM hits all of them alike. Then N
sandboxes run concurrently and the script reports leaked processes and cgroups, which
must be zero. Needs root and bubblewrap, like the runner itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runs.sandbox import (  # noqa: E402
    Limits,
    SandboxSettings,
    SandboxSpec,
    probe_host,
    release_spares,
    run_in_sandbox,
    wait_for_teardown,
    workspace_create,
    workspace_release,
)
from runs.sandbox.cgroup import CgroupLayout  # noqa: E402
from runs.sandbox.launch import bwrap_argv, setpriv_argv  # noqa: E402
from runs.sandbox.ownership import owner_tag  # noqa: E402
from runs.sandbox.tmpfs import mount_tmpfs, unmount_tmpfs  # noqa: E402

SETTINGS = SandboxSettings(
    workspace_root=Path("/var/lib/agent-sandbox-bench/workspaces"),
    state_dir=Path("/var/lib/agent-sandbox-bench/state"),
    cgroup_group="agent-sandbox-bench",
)


TEARDOWN = "…+teardown"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def leaks(settings: SandboxSettings) -> dict[str, list[str]]:
    tag = owner_tag()
    cgroups = [
        str(p)
        for base in CgroupLayout.detect().group_dirs(settings.cgroup_group)
        if base.is_dir()
        for p in base.iterdir()
        if p.name.startswith(tag)
    ]
    procs = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            uid_line = next(x for x in status.splitlines() if x.startswith("Uid:"))
            if int(uid_line.split()[1]) == settings.sandbox_uid:
                procs.append(entry)
    runs = settings.state_dir / "runs"
    run_dirs = [str(p) for p in runs.iterdir()] if runs.is_dir() else []
    return {"cgroups": cgroups, "processes": procs, "run_dirs": run_dirs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--concurrent", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print figures as JSON")
    args = parser.parse_args(argv)
    if shutil.which("bwrap") is None:
        print("bubblewrap missing: apt-get install bubblewrap", file=sys.stderr)
        return 2
    Path("/var/lib/agent-sandbox-bench").mkdir(exist_ok=True)
    os.chmod("/var/lib/agent-sandbox-bench", 0o711)
    caps = probe_host(SETTINGS)
    assert caps.bwrap is not None and caps.setpriv is not None
    ws = workspace_create(settings=SETTINGS, label="bench")
    raw_tmp = SETTINGS.state_dir / f"bench-tmp-{os.getpid()}"
    raw_shm = SETTINGS.state_dir / f"bench-shm-{os.getpid()}"
    try:
        uid, gid = SETTINGS.sandbox_uid, SETTINGS.sandbox_gid
        # The same noexec 64 MiB tmpfs bound at /tmp and /dev/shm as the runner
        # mounts per run.
        mount_tmpfs(raw_tmp, 64 << 20)
        mount_tmpfs(raw_shm, 64 << 20)
        raw = setpriv_argv(caps.setpriv, uid, gid) + bwrap_argv(
            caps.bwrap,
            uid=uid,
            gid=gid,
            workspace=ws,
            tmp_source=raw_tmp,
            shm_source=raw_shm,
        )
        # The floor of any Python init: bubblewrap starting an empty interpreter.
        floor = [*raw, SETTINGS.python, "-S", "-E", "-I", "-B", "-c", "pass"]
        raw.append("true")
        spec = SandboxSpec(argv=["true"], workspace=ws, limits=Limits())
        ways: dict[str, Callable[[], object]] = {
            "subprocess.run": lambda: subprocess.run(["true"], check=True),
            "raw bwrap": lambda: subprocess.run(raw, check=True, cwd="/"),
            "run_in_sandbox": lambda: run_in_sandbox(spec, SETTINGS),
            "bwrap+empty py": lambda: subprocess.run(floor, check=True, cwd="/"),
        }
        for fn in ways.values():  # warm-up: page cache, probe, init install
            for _ in range(5):
                fn()
        wait_for_teardown()
        order = [*ways][:3] + [TEARDOWN] + [*ways][3:]
        samples: dict[str, list[float]] = {name: [] for name in order}
        for _ in range(args.runs):
            for name, fn in ways.items():
                samples[name].append(timed(fn))
                if name == "run_in_sandbox":
                    samples[TEARDOWN].append(
                        samples[name][-1] + timed(wait_for_teardown)
                    )
        figures = {
            name: {
                "p50_ms": round(statistics.median(xs), 2),
                "p99_ms": round(percentile(xs, 0.99), 2),
            }
            for name, xs in samples.items()
        }
        p50 = {name: f["p50_ms"] for name, f in figures.items()}
        ratio_bwrap = p50["run_in_sandbox"] / p50["raw bwrap"]
        ratio_plain = p50["run_in_sandbox"] / p50["subprocess.run"]
        ratio_floor = p50["bwrap+empty py"] / p50["raw bwrap"]
        busy = SandboxSpec(
            argv=["/usr/bin/python3", "-c", "print(sum(range(10**6)))"],
            workspace=ws,
            limits=Limits(wall_seconds=60),
        )
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.concurrent) as pool:
            results = list(
                pool.map(
                    lambda _: run_in_sandbox(busy, SETTINGS), range(args.concurrent)
                )
            )
        wall = (time.perf_counter() - start) * 1000
        release_spares()  # waits for the teardown; the spares are not leaks
        ok = sum(1 for r in results if r.ok and r.stdout.strip() == "499999500000")
        leaked = leaks(SETTINGS)
    finally:
        unmount_tmpfs(raw_tmp)
        unmount_tmpfs(raw_shm)
        workspace_release(ws, settings=SETTINGS)
    report = {
        "runs": args.runs,
        "figures": figures,
        "ratio_p50_vs_raw_bwrap": round(ratio_bwrap, 2),
        "ratio_p50_vs_subprocess": round(ratio_plain, 2),
        "ratio_p50_empty_python_in_bwrap_vs_raw_bwrap": round(ratio_floor, 2),
        "load_average": os.getloadavg(),
        "target_ratio_vs_raw_bwrap": 1.5,
        "concurrent": {
            "n": args.concurrent,
            "ok": ok,
            "wall_ms": round(wall, 1),
            "all_reap_confirmed": all(r.reap_confirmed for r in results),
            "leaked_cgroups": len(leaked["cgroups"]),
            "leaked_processes": len(leaked["processes"]),
            "leaked_run_dirs": len(leaked["run_dirs"]),
        },
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{'way':<16} {'p50 ms':>8} {'p99 ms':>8}   ({args.runs} runs of `true`)")
        for name, f in figures.items():
            print(f"{name:<16} {f['p50_ms']:>8.2f} {f['p99_ms']:>8.2f}")
        print(f"run_in_sandbox / raw bwrap p50: {ratio_bwrap:.2f}x (target <= 1.5x)")
        print(f"run_in_sandbox / subprocess p50: {ratio_plain:.2f}x")
        print(
            f"floor of a Python init (empty python3 -S in bwrap) / raw bwrap p50: "
            f"{ratio_floor:.2f}x"
        )
        print("load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        c = report["concurrent"]
        print(
            f"{c['n']} concurrent sandboxes: {c['ok']}/{c['n']} ok "
            f"in {c['wall_ms']} ms; "
            f"leaked cgroups={c['leaked_cgroups']} processes={c['leaked_processes']} "
            f"run dirs={c['leaked_run_dirs']}"
        )
    clean = report["concurrent"]
    failed = (
        clean["ok"] != args.concurrent
        or clean["leaked_cgroups"]
        or clean["leaked_processes"]
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
