"""Judge one finished run from what the runner observed: never from what the workload
claims, and never from a wrapper's exit code (§6.3 #2)."""

from __future__ import annotations

import errno
import signal as _signal
from dataclasses import dataclass, field
from typing import Any

from .result import ERROR_FOR_CAUSE, ExitStatus, TerminationCause, decode_waitid

# A filesystem with less room than this at the end of a run counts as full: tmpfs
# reports whole pages, ext4 may keep a few blocks back.
DISK_FULL_BYTES = 16 * 1024


@dataclass
class Observation:
    """Everything the runner saw about one run."""

    init_status: dict[str, Any] | None
    launcher_returncode: int | None
    killed_for: str | None  # "wall_clock" | "output_limit" | "pids_limit" | None
    counters: dict[str, int]
    cpu_hard_seconds: int | None
    output_cap: int
    out_bytes: int
    err_bytes: int
    full_filesystems: list[str] = field(default_factory=list)  # with evidence
    launcher_stderr_tail: str = ""
    extra_detail: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    ok: bool
    status: ExitStatus
    cause: TerminationCause
    error: str | None
    detail: str
    timed_out: bool
    output_limited: bool


def judge(obs: Observation) -> Verdict:
    status = _workload_status(obs)
    details = list(obs.extra_detail)
    init = obs.init_status or {}
    counters = obs.counters
    output_limited = obs.out_bytes + obs.err_bytes > 2 * obs.output_cap
    timed_out = obs.killed_for == "wall_clock"
    cpu_ms = int(init.get("utime_ms", 0)) + int(init.get("stime_ms", 0))
    full = obs.full_filesystems
    sig = status.signal
    error: str | None = None
    cause: TerminationCause
    if obs.killed_for == "output_limit" or output_limited:
        cause = "output_limit"
        details.append(
            f"output {obs.out_bytes}+{obs.err_bytes} bytes "
            f"exceeded 2 x {obs.output_cap}"
        )
    elif counters.get("oom_kill", 0) > 0:
        cause = "memory_limit"
        details.append(f"cgroup OOM killer ran {counters['oom_kill']} time(s)")
    elif obs.killed_for == "pids_limit" or (
        counters.get("pids_max_events", 0) > 0 and not _clean_exit(status)
    ):
        cause = "pids_limit"
        details.append(
            f"pids limit refused {counters.get('pids_max_events', 0)} fork(s)"
        )
    elif sig == _signal.SIGXCPU or (
        sig == _signal.SIGKILL
        and obs.cpu_hard_seconds is not None
        and obs.killed_for is None
        # A SIGKILL that neither the runner nor the OOM killer sent, after the
        # workload outlived its soft limit (so it caught or ignored SIGXCPU), is the
        # hard RLIMIT_CPU. The rusage total reads low under load (1.8 s measured for
        # a kill at the 2 s hard limit), so compare with the soft limit, not the hard.
        and cpu_ms >= (obs.cpu_hard_seconds - 1) * 1000 * 0.9
    ):
        cause = "cpu_limit"
        details.append(f"RLIMIT_CPU reached after {cpu_ms} ms of CPU time")
    elif timed_out:
        cause = "wall_clock"
        details.append("wall-clock limit reached; the whole tree was killed")
    elif sig == _signal.SIGXFSZ:
        cause = "disk_full"
        error = "EFBIG"
        details.append("RLIMIT_FSIZE exceeded (SIGXFSZ); file left partial")
    elif full:
        cause = "disk_full"
        details.append(f"no space left on {'; '.join(full)}; files may be partial")
    elif "setup_error" in init:
        cause = "exit"
        error = "ESANDBOX"
        details.append(f"sandbox setup failed, nothing ran: {init['setup_error']}")
    elif "spawn_errno" in init:
        cause = "exit"
        code = int(init["spawn_errno"])
        error = errno.errorcode.get(code, "ESPAWN")
        details.append(f"could not execute the command: {init.get('spawn_error', '')}")
        status = ExitStatus(exit_code=127 if code == errno.ENOENT else 126, signal=None)
    elif obs.init_status is None:
        cause = "signal" if sig is not None else "exit"
        error = "ESANDBOX"
        details.append("the sandbox did not report a status")
        if obs.launcher_stderr_tail:
            details.append(obs.launcher_stderr_tail)
    elif sig is not None:
        cause = "signal"
    else:
        cause = "exit"
    if error is None:
        error = ERROR_FOR_CAUSE.get(cause)
    ok = cause == "exit" and error is None and status.exit_code == 0
    return Verdict(
        ok=ok,
        status=status,
        cause=cause,
        error=error,
        detail="; ".join(d for d in details if d),
        timed_out=timed_out,
        output_limited=output_limited,
    )


def _clean_exit(status: ExitStatus) -> bool:
    return status.exit_code == 0


def _workload_status(obs: Observation) -> ExitStatus:
    init = obs.init_status
    if init and "si_code" in init:
        return decode_waitid(int(init["si_code"]), int(init["si_status"]))
    if obs.killed_for is not None or obs.counters.get("oom_kill", 0) > 0:
        # The runner (or the OOM killer) killed the init before it could report; the
        # namespace died with it, so the workload died of SIGKILL.
        return ExitStatus(exit_code=None, signal=int(_signal.SIGKILL))
    return ExitStatus(exit_code=None, signal=None)
