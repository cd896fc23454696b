"""A long-lived sandboxed process the caller talks to over its stdin and stdout.

The same runner as `run_in_sandbox` (every isolation layer, the wall clock, the
whole-tree kill, the judged result), with two pipes instead of the memory files
for stdin and stdout: an MCP stdio server, say, runs inside the sandbox for one
session while the caller exchanges JSON-RPC lines with it. stderr stays a capped
memory file, read into the result.

The runner watches the process on a thread of its own. `stop()` closes stdin (a
well-behaved server exits), then has the runner kill the whole tree; the wall
clock kills it anyway, so no sandbox outlives its deadline whatever the caller
does.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from .capabilities import (
    HostCapabilities,
    SandboxUnavailable,
    probe_host,
    require_layers,
)
from .result import SandboxResult
from .runner import _enforcement, _Files, _memfd, _Run
from .spec import SandboxSettings, SandboxSpec, SandboxSpecError, validate_spec

_STOP_JOIN_SECONDS = 15.0


class _PipedRun(_Run):
    """A `_Run` whose stdin and stdout are pipes, stoppable from another thread."""

    def __init__(
        self,
        spec: SandboxSpec,
        settings: SandboxSettings,
        caps: HostCapabilities,
        workspace: Path,
        enforcement: dict[str, Any],
        stdin_read: int,
        stdout_write: int,
    ) -> None:
        super().__init__(spec, settings, caps, workspace, enforcement)
        self.stdin_read = stdin_read
        self.stdout_write = stdout_write
        self.stop_requested = threading.Event()

    def _open_files(self) -> _Files:
        # The run closes these three once the process has exited (execute()).
        return _Files(
            out=self.stdout_write, err=_memfd("stderr"), stdin=self.stdin_read
        )

    def _between_waits(self, files: _Files) -> str | None:
        """A stop request, or stderr over its cap: stdout is a pipe the caller
        reads (and bounds)."""
        if self.stop_requested.is_set():
            return "stopped"
        if os.fstat(files.err).st_size > 2 * self.spec.limits.output_bytes:
            return "output_limit"
        return None


class SandboxProcess:
    """A running sandboxed process: write to `stdin`, read from `stdout` (raw fds,
    owned by this object), then `stop()` it, which returns the judged result."""

    def __init__(self, run: _PipedRun, stdin: int, stdout: int) -> None:
        self.stdin = stdin
        self.stdout = stdout
        self._run = run
        self._result: SandboxResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._execute, name="sandbox-piped", daemon=True
        )
        self._stdin_open = True
        self._stdout_open = True

    def _start(self) -> None:
        self._thread.start()

    def _execute(self) -> None:
        try:
            self._result = self._run.execute()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self._error = exc

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def error(self) -> BaseException | None:
        """Why the sandbox could not run (SandboxUnavailable, say), once it ended."""
        return self._error

    def close_stdin(self) -> None:
        if self._stdin_open:
            self._stdin_open = False
            os.close(self.stdin)

    def stop(self, grace_seconds: float = 2.0) -> SandboxResult | None:
        """Close stdin, give the process `grace_seconds` to exit, then kill the
        tree; waits for the runner to finish and returns its result (None if it
        failed: see `error`)."""
        self.close_stdin()
        self._thread.join(grace_seconds)
        if self._thread.is_alive():
            self._run.stop_requested.set()
            self._thread.join(_STOP_JOIN_SECONDS)
        if self._stdout_open:
            self._stdout_open = False
            os.close(self.stdout)
        return self._result


def open_sandbox_process(
    spec: SandboxSpec, settings: SandboxSettings | None = None
) -> SandboxProcess:
    """Start `spec.argv` in the sandbox with piped stdin and stdout.

    Raises SandboxSpecError for bad input and SandboxUnavailable when the host
    cannot provide `settings.required_layers`, before anything is spawned.
    `spec.limits.wall_seconds` bounds the whole session.
    """
    settings = settings or SandboxSettings()
    settings.validate()
    if spec.stdin_data is not None:
        raise SandboxSpecError("a piped sandbox process takes no stdin_data")
    if spec.paths:
        raise SandboxSpecError("a piped sandbox process takes no paths")
    workspace = validate_spec(spec, settings)
    caps = probe_host(settings)
    planned = caps.planned_layers()
    require_layers(planned, settings.required_layers)
    if not spec.network.is_none and not planned["netns"]:
        raise SandboxUnavailable(["netns"], "a network allowlist needs a netns")
    enforcement = _enforcement(caps, planned, spec, settings, workspace)
    stdin_read, stdin_write = os.pipe2(os.O_CLOEXEC)
    stdout_read, stdout_write = os.pipe2(os.O_CLOEXEC)
    run = _PipedRun(
        spec, settings, caps, workspace, enforcement, stdin_read, stdout_write
    )
    process = SandboxProcess(run, stdin_write, stdout_read)
    try:
        process._start()
    except BaseException:
        for fd in (stdin_read, stdin_write, stdout_read, stdout_write):
            os.close(fd)
        raise
    return process
