"""Disk and output limits (T-DISK-1, T-RL-5, T-RUN-4, OUT-*)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from runs.sandbox import (
    Limits,
    SandboxSettings,
    SandboxSpec,
    run_in_sandbox,
    workspace_create,
    workspace_release,
)

from .conftest import PYTHON, run_python

ROOT = Path(__file__).resolve().parents[2]

FILL_TMP = """
import sys
written = 0
try:
    with open("/tmp/big", "wb") as f:
        while True:
            f.write(b"x" * 65536)
            f.flush()
            written += 65536
except OSError as exc:
    import os
    print(exc.errno, os.path.getsize("/tmp/big"), flush=True)
    sys.exit(1)
"""


def test_filling_tmpfs_gives_edisk_with_partial_file(
    settings: SandboxSettings, workspace: Path
) -> None:
    r = run_python(settings, workspace, FILL_TMP, Limits(tmpfs_mb=8))
    errno_seen, size = (int(x) for x in r.stdout.split())
    assert errno_seen == 28  # ENOSPC inside
    assert 0 < size <= 8 * 1024 * 1024  # partial: stopped at the tmpfs size
    assert r.termination_cause == "disk_full" and r.error == "EDISK"
    assert r.retryable is False and r.ok is False


def test_dd_into_full_tmpfs_is_edisk(
    settings: SandboxSettings, workspace: Path
) -> None:
    argv = ["dd", "if=/dev/zero", "of=/tmp/big", "bs=1M", "count=20"]
    r = run_in_sandbox(
        SandboxSpec(argv=argv, workspace=workspace, limits=Limits(tmpfs_mb=8)), settings
    )
    assert r.exit_code == 1 and "No space left on device" in r.stderr
    assert r.error == "EDISK"


# T-DISK-2: many files, each under RLIMIT_FSIZE (64 MiB), 1.2 GB in all.
FILL_WORKSPACE = """
import os, sys
written = 0
try:
    for i in range(75):
        with open(f"part{i:02}.bin", "wb") as f:
            for _ in range(256):
                written += f.write(b"x" * 65536)
except OSError as exc:
    print(exc.errno, written, flush=True)
    sys.exit(1)
print("wrote", written)
"""


def test_filling_the_workspace_gives_edisk(settings: SandboxSettings) -> None:
    # Before: a workspace was a plain directory on the host disk and only the
    # per-file limit applied, so 1.2 GB in 16 MiB files ended ok: true.
    small = replace(settings, workspace_mb=8)
    ws = workspace_create(settings=small, label="full")
    try:
        r = run_python(small, ws, FILL_WORKSPACE)
        errno_seen, written = (int(x) for x in r.stdout.split())
        assert errno_seen == 28  # ENOSPC inside
        assert 0 < written <= 8 * 1024 * 1024
        assert r.error == "EDISK" and r.termination_cause == "disk_full"
        assert r.ok is False and r.retryable is False
        assert "/workspace" in (r.detail or "")
        assert r.enforcement["workspace_size"] == 8 * 1024 * 1024
        # The evidence stays: the files as far as they got, nothing more.
        sizes = [p.stat().st_size for p in ws.iterdir()]
        assert 0 < sum(sizes) <= 8 * 1024 * 1024
    finally:
        workspace_release(ws, settings=small)
    assert not ws.exists()
    assert not [line for line in _mounts() if str(ws) in line]


def test_the_default_workspace_is_bounded_through_the_cli(
    settings: SandboxSettings,
) -> None:
    # The CLI makes its own workspace with the default size (128 MiB).
    env = {
        "PATH": "/usr/bin:/bin",
        "SANDBOX_WORKSPACE_ROOT": str(settings.workspace_root),
        "SANDBOX_STATE_DIR": str(settings.state_dir),
    }
    before = set(settings.workspace_root.iterdir())
    proc = subprocess.run(
        [sys.executable, "-m", "runs.sandbox", "--", PYTHON, "-c", FILL_WORKSPACE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["ok"], result["error"], result["termination_cause"]) == (
        False,
        "EDISK",
        "disk_full",
    )
    errno_seen, written = (int(x) for x in result["stdout"].split())
    assert errno_seen == 28 and written <= 128 * 1024 * 1024
    assert result["enforcement"]["workspace_size"] == 128 * 1024 * 1024
    # Its workspace and the tmpfs under it are gone with it.
    assert set(settings.workspace_root.iterdir()) == before
    assert not [line for line in _mounts() if "/cli-r" in line]


def test_a_workspace_of_its_own_size_is_reported(
    settings: SandboxSettings, workspace: Path
) -> None:
    r = run_python(settings, workspace, "pass")
    assert r.ok and r.enforcement["workspace_size"] == 128 * 1024 * 1024
    # A directory the caller made on the workspace root's own filesystem has no
    # total bound; the map says so instead of claiming one.
    plain = replace(settings, workspace_mb=None)
    ws = workspace_create(settings=plain, label="plain")
    try:
        r = run_python(plain, ws, "pass")
        assert r.ok and r.enforcement["workspace_size"] is None
    finally:
        workspace_release(ws, settings=plain)


def _mounts() -> list[str]:
    return Path("/proc/self/mountinfo").read_text().splitlines()


def test_file_size_limit_kills_dd_with_sigxfsz(
    settings: SandboxSettings, workspace: Path
) -> None:
    argv = ["dd", "if=/dev/zero", "of=big.bin", "bs=1M", "count=3"]
    r = run_in_sandbox(
        SandboxSpec(argv=argv, workspace=workspace, limits=Limits(fsize_mb=1)), settings
    )
    assert (r.signal, r.signal_name, r.error) == (25, "SIGXFSZ", "EFBIG")
    assert (workspace / "big.bin").stat().st_size == 1024 * 1024


def test_file_size_limit_gives_python_efbig(
    settings: SandboxSettings, workspace: Path
) -> None:
    code = "open('big.bin','wb').write(b'x' * (3 * 1024 * 1024))"
    r = run_python(settings, workspace, code, Limits(fsize_mb=1))
    assert r.exit_code == 1 and "File too large" in r.stderr


def test_output_flood_is_cut_at_the_cap(
    settings: SandboxSettings, workspace: Path
) -> None:
    spec = SandboxSpec(
        argv=["yes"],
        workspace=workspace,
        limits=Limits(output_bytes=4096, wall_seconds=10),
    )
    r = run_in_sandbox(spec, settings)
    assert r.output_limited and r.stdout_truncated and not r.timed_out
    assert r.termination_cause == "output_limit" and r.error == "EOUTPUT"
    assert len(r.stdout.encode()) == 4096 and r.bytes["stdout"] > 8192
    # RLIMIT_FSIZE bounds what can be written between two polls (OUT-4).
    assert r.bytes["stdout"] <= Limits().fsize_mb * 1024 * 1024  # type: ignore[operator]
    assert r.duration_ms < 2000


def test_print_over_the_cap(settings: SandboxSettings, workspace: Path) -> None:
    r = run_python(settings, workspace, 'print("x"*200000)', Limits(output_bytes=4096))
    assert (r.ok, r.output_limited, r.stdout_truncated) == (False, True, True)
    # The workload is stopped at the first poll that sees the cap passed: on a
    # busy machine that may be before it has written everything.
    assert 4096 < r.bytes["stdout"] <= 200001 and r.bytes["stderr"] == 0
    assert len(r.stdout) == 4096


def test_output_under_the_cap_is_whole(
    settings: SandboxSettings, workspace: Path
) -> None:
    code = "import sys; sys.stdout.write('a'*3000); sys.stderr.write('b'*10)"
    r = run_python(settings, workspace, code, Limits(output_bytes=4096))
    assert r.ok and r.stdout == "a" * 3000 and r.stderr == "b" * 10
    assert not r.stdout_truncated and not r.output_limited


def test_stdin_data_is_delivered(settings: SandboxSettings, workspace: Path) -> None:
    spec = SandboxSpec(argv=["cat"], workspace=workspace, stdin_data=b"hello\n")
    assert run_in_sandbox(spec, settings).stdout == "hello\n"
    r = run_in_sandbox(SandboxSpec(argv=["cat"], workspace=workspace), settings)
    assert r.ok and r.stdout == ""  # stdin is /dev/null by default


def test_output_and_input_cannot_be_reopened_or_rewritten(
    settings: SandboxSettings, workspace: Path
) -> None:
    # stdout/stderr/stdin are root-only (0600) memory files: the workload writes to
    # the fds it was given, but cannot reopen them through /proc (nor could any
    # other uid-65534 process), and its stdin is read-only and sealed.
    script = (
        "echo a; echo x > /proc/self/fd/1 || echo no-reopen-out; "
        "cat /proc/self/fd/0 || echo no-reopen-in; "
        "echo y >&0 || echo no-write-in; cat"
    )
    spec = SandboxSpec(
        argv=["sh", "-c", script], workspace=workspace, stdin_data=b"in\n"
    )
    r = run_in_sandbox(spec, settings)
    assert r.stdout == "a\nno-reopen-out\nno-reopen-in\nno-write-in\nin\n", r.stderr
    assert r.stderr.count("Permission denied") == 2


def test_workspace_files_survive_and_belong_to_sandbox_uid(
    settings: SandboxSettings, workspace: Path
) -> None:
    r = run_python(settings, workspace, "open('made.txt','w').write('ok')")
    assert r.ok and (workspace / "made.txt").read_text() == "ok"
    assert os.stat(workspace / "made.txt").st_uid == settings.sandbox_uid
