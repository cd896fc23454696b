"""The result of one sandboxed run, and exact exit decoding (spec §1.2, §3.4)."""

from __future__ import annotations

import os
import signal as _signal
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

TerminationCause = Literal[
    "exit",
    "signal",
    "wall_clock",
    "cpu_limit",
    "memory_limit",
    "pids_limit",
    "output_limit",
    "disk_full",
    "path_refused",
    "not_started",
]

# Error codes. EPATH/EDISK/ETIMEDOUT come from the book; the rest are project
# extensions so that every termination cause has a stable code.
ERROR_FOR_CAUSE: dict[str, str] = {
    "wall_clock": "ETIMEDOUT",
    "cpu_limit": "ECPU",
    "memory_limit": "EMEMORY",
    "pids_limit": "EPIDS",
    "output_limit": "EOUTPUT",
    "disk_full": "EDISK",
    "path_refused": "EPATH",
}


@dataclass
class SandboxResult:
    """What happened, judged by the runner from what it observed (not self-reported)."""

    ok: bool
    exit_code: int | None
    signal: int | None
    signal_name: str | None
    timed_out: bool
    termination_cause: TerminationCause
    output_limited: bool
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    bytes: dict[str, int]
    duration_ms: int
    max_rss_kb: int | None
    error: str | None
    detail: str
    enforcement: dict[str, Any]
    reap_confirmed: bool
    core_dumped: bool = False
    retryable: bool = False
    counters: dict[str, int] = field(default_factory=dict)
    # One entry per proxy connection (the first MAX_LOG_ENTRIES), and every
    # connection counted by decision ("allow", "deny", "error").
    network_log: list[dict[str, Any]] = field(default_factory=list)
    network_counts: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return asdict(self)


@dataclass(frozen=True)
class ExitStatus:
    """A decoded exit: either an exit code or a terminating signal, never both."""

    exit_code: int | None
    signal: int | None
    core_dumped: bool = False

    @property
    def signal_name(self) -> str | None:
        return signal_name(self.signal)


def signal_name(signum: int | None) -> str | None:
    if signum is None:
        return None
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


def decode_wait_status(status: int) -> ExitStatus:
    """Decode a raw wait(2) status with the macros, WIFEXITED first (WS-1..5).

    0x2a00 is exit 42, 0x000f is SIGTERM, 0x0086 is SIGABRT with a core; a stopped or
    continued status has neither an exit code nor a terminating signal.
    """
    if os.WIFEXITED(status):
        return ExitStatus(exit_code=os.WEXITSTATUS(status), signal=None)
    if os.WIFSIGNALED(status):
        return ExitStatus(
            exit_code=None, signal=os.WTERMSIG(status), core_dumped=os.WCOREDUMP(status)
        )
    return ExitStatus(exit_code=None, signal=None)


def decode_waitid(si_code: int, si_status: int) -> ExitStatus:
    """Decode waitid(2) siginfo: si_status is already an exit code or signal (WS-7)."""
    if si_code == os.CLD_EXITED:
        return ExitStatus(exit_code=si_status, signal=None)
    if si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return ExitStatus(
            exit_code=None, signal=si_status, core_dumped=si_code == os.CLD_DUMPED
        )
    return ExitStatus(exit_code=None, signal=None)


def decode_returncode(returncode: int) -> ExitStatus:
    """subprocess already decoded: >= 0 is an exit code, < 0 a signal (WS-6)."""
    if returncode >= 0:
        return ExitStatus(exit_code=returncode, signal=None)
    return ExitStatus(exit_code=None, signal=-returncode)
