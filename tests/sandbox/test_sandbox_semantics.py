"""The remaining Linux T- tests of spec §2, run inside the sandbox as uid 65534:
shell status semantics (T-PIPE-1, T-JOBS-1, T-RL-4), per-uid and per-process limits
(T-RL-7, T-RL-8), the per-file vs volume limit (T-DISK-2) and the mount boundary
(T-FS-1, T-FS-2)."""

from __future__ import annotations

from pathlib import Path

from runs.sandbox import Limits, SandboxSettings, SandboxSpec, run_in_sandbox

from .conftest import run_python


def bash(settings: SandboxSettings, workspace: Path, script: str) -> str:
    spec = SandboxSpec(argv=["bash", "-c", script], workspace=workspace)
    r = run_in_sandbox(spec, settings)
    assert r.termination_cause == "exit", r
    return r.stdout


def test_pipe_status(settings: SandboxSettings, workspace: Path) -> None:
    out = bash(
        settings,
        workspace,
        'false | true | false; echo "no pipefail: status=$? parts=${PIPESTATUS[*]}"\n'
        "set -o pipefail\n"
        "(exit 3) | (exit 5) | true; "
        'echo "pipefail:    status=$? parts=${PIPESTATUS[*]}"',
    )
    assert (
        out == "no pipefail: status=1 parts=1 0 1\npipefail:    status=5 parts=3 5 0\n"
    )


def test_jobs_table_is_per_shell(settings: SandboxSettings, workspace: Path) -> None:
    out = bash(
        settings,
        workspace,
        'sleep 30 & echo "parent=$(jobs -p | head -1)"; echo "sub=$( ( jobs -p ) )x"; '
        "kill %1",
    )
    lines = out.splitlines()
    assert lines[0] != "parent=" and lines[1] == "sub=x"


def test_ulimit_soft_hard_relations(settings: SandboxSettings, workspace: Path) -> None:
    out = bash(
        settings,
        workspace,
        "ulimit -Sn 64; echo S $(ulimit -Sn) $(ulimit -Hn)\n"
        "ulimit -Hn 128; echo H $(ulimit -Sn) $(ulimit -Hn)\n"
        "ulimit -Hn 32 2>/dev/null && echo lowered-below-soft "
        "|| echo refused-below-soft\n"
        "ulimit -n 100; echo both $(ulimit -Sn) $(ulimit -Hn)\n"
        "ulimit -Hn 200 2>/dev/null && echo raised || echo raise-refused",
    )
    lines = out.splitlines()
    assert lines[0].split()[1] == "64"  # -S leaves the hard limit alone
    assert lines[1] == "H 64 128"  # -H leaves the soft limit alone
    assert lines[2] == "refused-below-soft"  # hard below soft: EINVAL
    assert lines[3] == "both 100 100"  # bash: no -S/-H sets both
    assert lines[4] == "raise-refused"  # unprivileged: EPERM


NPROC = """
import os, resource, time
resource.setrlimit(resource.RLIMIT_NPROC, (5, 5))
made = 0
try:
    for _ in range(20):
        if os.fork() == 0:
            time.sleep(2)
            os._exit(0)
        made += 1
except OSError as exc:
    print("forks", made, "errno", exc.errno)
"""


def test_nproc_is_enforced_for_the_sandbox_uid(
    settings: SandboxSettings, workspace: Path
) -> None:
    r = run_python(settings, workspace, NPROC)
    # Counted per real uid: the init and the workload already count.
    forks, errno_seen = int(r.stdout.split()[1]), int(r.stdout.split()[3])
    assert forks < 5 and errno_seen == 11  # EAGAIN


def test_hard_limit_cannot_be_raised_back(
    settings: SandboxSettings, workspace: Path
) -> None:
    code = """
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (16, 64))
    print("raised")
except ValueError:
    print("refused")
"""
    assert run_python(settings, workspace, code).stdout == "refused\n"


def test_many_small_files_meet_the_volume_limit_not_fsize(
    settings: SandboxSettings, workspace: Path
) -> None:
    code = """
import sys
for i in range(10_000):
    with open(f"/tmp/f{i}", "wb") as f:
        f.write(b"x" * 4096)
"""
    r = run_python(settings, workspace, code, Limits(fsize_mb=1, tmpfs_mb=8))
    assert "No space left on device" in r.stderr  # each file is far below FSIZE
    assert r.error == "EDISK"


def test_mounts_are_private_to_the_sandbox(
    settings: SandboxSettings, workspace: Path
) -> None:
    code = """
mounts = [line.split()[4] for line in open("/proc/self/mountinfo")]
print(" ".join(sorted(mounts)))
"""
    r = run_python(settings, workspace, code)
    inside = set(r.stdout.split())
    assert {"/", "/usr", "/etc", "/proc", "/dev", "/tmp", "/workspace"} <= inside
    assert not inside & {"/work", "/root", "/sys", "/var"}
    host = {
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    }
    assert "/workspace" not in host  # the host never sees the sandbox's mounts
