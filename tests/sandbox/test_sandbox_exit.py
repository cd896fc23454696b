"""Exit decoding (T-WAIT-1..3, WS-*) and the basic runs T-RUN-1/2, T-RUN-NOFILE."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from runs.sandbox import (
    Limits,
    SandboxSettings,
    SandboxSpec,
    SandboxSpecError,
    decode_wait_status,
    decode_waitid,
    init_install,
    run_in_sandbox,
)
from runs.sandbox.result import decode_returncode

from .conftest import run_python

run = run_python


def test_normal_exit_is_success(settings: SandboxSettings, workspace: Path) -> None:
    r = run(settings, workspace, "print(6*7)")
    assert (r.ok, r.exit_code, r.signal, r.timed_out) == (True, 0, None, False)
    assert r.stdout == "42\n"
    assert r.termination_cause == "exit" and r.error is None
    assert r.reap_confirmed is True
    assert r.max_rss_kb is not None and r.max_rss_kb > 0


def test_nonzero_exit_is_not_success(
    settings: SandboxSettings, workspace: Path
) -> None:
    r = run(settings, workspace, "import sys; sys.exit(42)")
    assert (r.ok, r.exit_code, r.signal, r.timed_out) == (False, 42, None, False)
    assert r.termination_cause == "exit"


def test_signal_is_not_an_exit_code(settings: SandboxSettings, workspace: Path) -> None:
    r = run(
        settings, workspace, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    )
    assert (r.ok, r.exit_code, r.signal, r.signal_name) == (False, None, 15, "SIGTERM")
    assert r.termination_cause == "signal"


def test_abort_reports_sigabrt_without_core(
    settings: SandboxSettings, workspace: Path
) -> None:
    # RLIMIT_CORE is 0 inside, so SIGABRT never carries a core (WS-3).
    r = run(settings, workspace, "import os; os.abort()")
    assert (r.exit_code, r.signal, r.signal_name, r.core_dumped) == (
        None,
        6,
        "SIGABRT",
        False,
    )


def test_exit_137_is_not_sigkill(settings: SandboxSettings, workspace: Path) -> None:
    # A wrapper's exit code would make these two identical (§6.3 #2).
    exited = run(settings, workspace, "import sys; sys.exit(137)")
    killed = run(settings, workspace, "import os; os.kill(os.getpid(), 9)")
    assert (exited.exit_code, exited.signal) == (137, None)
    assert (killed.exit_code, killed.signal) == (None, 9)


def test_workload_is_not_pid_1(settings: SandboxSettings, workspace: Path) -> None:
    r = run(settings, workspace, "import os; print(os.getpid(), os.getppid())")
    assert r.stdout.split() == ["2", "1"]


def test_nofile_limit_is_applied(settings: SandboxSettings, workspace: Path) -> None:
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"
    r = run(settings, workspace, code, Limits(nofile=32))
    assert r.ok and r.stdout == "(32, 32)\n"


def test_missing_command_is_enoent_127(
    settings: SandboxSettings, workspace: Path
) -> None:
    spec = SandboxSpec(argv=["no-such-command-xyz"], workspace=workspace)
    r = run_in_sandbox(spec, settings)
    assert (r.ok, r.exit_code, r.error) == (False, 127, "ENOENT")


def test_decode_wait_status_macros() -> None:
    assert decode_wait_status(0x2A00).exit_code == 42
    assert decode_wait_status(0x0100).exit_code == 1
    term = decode_wait_status(0x000F)
    assert (term.exit_code, term.signal, term.core_dumped) == (None, 15, False)
    core = decode_wait_status(0x0086)
    assert (core.signal, core.core_dumped) == (6, True)
    stopped = decode_wait_status(0x137F)  # WIFSTOPPED by SIGSTOP
    assert (stopped.exit_code, stopped.signal) == (None, None)
    continued = decode_wait_status(0xFFFF)
    assert (continued.exit_code, continued.signal, continued.core_dumped) == (
        None,
        None,
        False,
    )


def test_anti_pattern_low_byte_is_not_success() -> None:
    status = 0x2A00
    assert (status & 0xFF) == 0  # the anti-pattern would call this success (T-WAIT-3)
    assert decode_wait_status(status).exit_code == 42


def test_decode_waitid_on_real_children() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(42)
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    assert info is not None
    assert decode_waitid(info.si_code, info.si_status).exit_code == 42
    os.waitpid(pid, 0)  # still reapable after WNOWAIT
    pid = os.fork()
    if pid == 0:
        os.kill(os.getpid(), signal.SIGTERM)
        os._exit(0)
    info = os.waitid(os.P_PID, pid, os.WEXITED)
    assert info is not None and info.si_code == os.CLD_KILLED
    assert decode_waitid(info.si_code, info.si_status).signal == 15


def test_decode_returncode() -> None:
    assert decode_returncode(-24).signal_name == "SIGXCPU"
    assert decode_returncode(3).exit_code == 3


def test_a_limit_that_cannot_be_applied_fails_closed(
    settings: SandboxSettings, workspace: Path
) -> None:
    # More open files than the host's hard limit: setrlimit fails inside, and the
    # workload must not run without it.
    spec = SandboxSpec(
        argv=["touch", "ran.txt"], workspace=workspace, limits=Limits(nofile=1 << 30)
    )
    r = run_in_sandbox(spec, settings)
    assert (r.ok, r.error, r.exit_code) == (False, "ESANDBOX", None)
    assert "setup failed" in r.detail
    assert not (workspace / "ran.txt").exists()


def test_a_sandbox_that_cannot_start_is_reported_not_raised(
    settings: SandboxSettings, workspace: Path
) -> None:
    # An interpreter that exists on the host but not inside (the venv's, under
    # /work and /root): bubblewrap's exec of the (Python) init fails early.
    broken = replace(settings, python=sys.executable, init="python")
    r = run_in_sandbox(SandboxSpec(argv=["true"], workspace=workspace), broken)
    assert (r.ok, r.error) == (False, "ESANDBOX")
    assert "bwrap" in r.detail and "No such file" in r.detail


def test_the_c_init_is_used_when_a_compiler_exists(
    settings: SandboxSettings, workspace: Path
) -> None:
    assert init_install.c_compiler() is not None  # the test host has cc
    spec = SandboxSpec(
        argv=["sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '; exit 3"],
        workspace=workspace,
    )
    r = run_in_sandbox(spec, settings)
    assert (r.exit_code, r.enforcement["init"]) == (3, "c")
    assert r.stdout.startswith("/run/sandbox/init status=")
    assert r.max_rss_kb is not None and "workload_cpu_ms" in r.counters


def test_the_python_init_still_works_when_forced_or_without_a_compiler(
    settings: SandboxSettings, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forced = replace(settings, init="python")
    spec = SandboxSpec(
        argv=["sh", "-c", "cat /proc/1/cmdline; exit 3"], workspace=workspace
    )
    r = run_in_sandbox(spec, forced)
    assert (r.exit_code, r.enforcement["init"]) == (3, "python")
    assert "/run/sandbox/init.pyc" in r.stdout
    missing = SandboxSpec(argv=["no-such-command-xyz"], workspace=workspace)
    r = run_in_sandbox(missing, forced)
    assert (r.exit_code, r.error, r.enforcement["init"]) == (127, "ENOENT", "python")
    monkeypatch.setattr(init_install, "c_compiler", lambda: None)
    r = run_in_sandbox(spec, settings)
    assert (r.exit_code, r.enforcement["init"]) == (3, "python")


def test_an_unknown_init_setting_is_refused(
    settings: SandboxSettings, workspace: Path
) -> None:
    spec = SandboxSpec(argv=["true"], workspace=workspace)
    with pytest.raises(SandboxSpecError):
        run_in_sandbox(spec, replace(settings, init="rust"))
