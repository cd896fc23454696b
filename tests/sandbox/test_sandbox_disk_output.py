"""Disk and output limits (T-DISK-1, T-RL-5, T-RUN-4, OUT-*)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from runs.sandbox import (
    Limits,
    SandboxSettings,
    SandboxSpec,
    run_in_sandbox,
    workspace_create,
    workspace_release,
)

from .conftest import TEST_ROOT, run_python

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


@pytest.fixture
def small_fs_settings(settings: SandboxSettings) -> Iterator[SandboxSettings]:
    """A workspace root on a 4 MiB tmpfs, so filling the workspace never fills the
    host disk (DK-5) and the partial file can be inspected from outside."""
    mount = TEST_ROOT / "smallfs"
    mount.mkdir(exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0711", "tmpfs", str(mount)],
        check=True,
    )
    try:
        yield replace(settings, workspace_root=mount)
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_filling_the_workspace_gives_edisk(small_fs_settings: SandboxSettings) -> None:
    ws = workspace_create(settings=small_fs_settings, label="full")
    try:
        argv = ["dd", "if=/dev/zero", "of=out.bin", "bs=1M", "count=10"]
        r = run_in_sandbox(SandboxSpec(argv=argv, workspace=ws), small_fs_settings)
        assert r.error == "EDISK" and r.termination_cause == "disk_full"
        size = (ws / "out.bin").stat().st_size
        assert 0 < size < 10 * 1024 * 1024  # the evidence: a partial file, kept
    finally:
        workspace_release(ws, settings=small_fs_settings)


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
    assert r.bytes == {"stdout": 200001, "stderr": 0}
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
