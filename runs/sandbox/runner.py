"""run_in_sandbox: validate, set up the cgroup and proxy, launch, watch, kill, judge."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import math
import os
import select
import shutil
import signal
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from . import launch, spare, teardown
from .capabilities import (
    HostCapabilities,
    SandboxUnavailable,
    probe_host,
    require_layers,
)
from .cgroup import RunCgroup
from .init_install import (
    InstalledInit,
    install_init,
    install_launcher,
    planned_init_kind,
)
from .ownership import run_name
from .paths import PathRefused, check_path
from .proxy import EgressProxy
from .result import SandboxResult
from .spec import SandboxSettings, SandboxSpec, validate_spec
from .tmpfs import mount_tmpfs, tmpfs_usage, unmount_tmpfs
from .verdict import DISK_FULL_BYTES, Observation, judge
from .workspace import workspace_size

_TICK_SECONDS = 0.01  # how often output size and pids events are polled
_REAP_TIMEOUT = 5.0
_BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": launch.WORKSPACE_INSIDE,
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
}


def run_in_sandbox(
    spec: SandboxSpec, settings: SandboxSettings | None = None
) -> SandboxResult:
    """Run `spec.argv` under every available isolation layer and judge the outcome.

    Raises SandboxSpecError for bad input and SandboxUnavailable when the host cannot
    provide `settings.required_layers`; both happen before anything is spawned.
    """
    settings = settings or SandboxSettings()
    settings.validate()
    workspace = validate_spec(spec, settings)
    caps = probe_host(settings)
    planned = caps.planned_layers()
    require_layers(planned, settings.required_layers)
    if not spec.network.is_none and not planned["netns"]:
        # The proxy bridge lives inside the sandbox's own network namespace; without
        # one an allowlist cannot be enforced at all.
        raise SandboxUnavailable(["netns"], "a network allowlist needs a netns")
    enforcement = _enforcement(caps, planned, spec, settings, workspace)
    for rel in spec.paths:
        try:
            check_path(workspace, rel)
        except PathRefused as refused:
            return _refused(refused, enforcement)
    return _Run(spec, settings, caps, workspace, enforcement).execute()


class _Process(Protocol):
    """What the runner uses of the sandbox's top process (bubblewrap)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class _Adopted:
    """Bubblewrap made the runner's own child by the launcher (CLONE_PARENT), so
    the runner is woken by bubblewrap's exit itself. Waited for on a pidfd;
    Popen-like where the runner needs it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        # The pid cannot be reused before we reap it: it is our child.
        self.pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and timeout is not None:
            ready = select.poll()
            ready.register(self.pidfd, select.POLLIN)
            if not ready.poll(max(0.0, timeout) * 1000):
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        code = self._reap(0)
        assert code is not None
        return code

    def close(self) -> None:
        os.close(self.pidfd)

    def _reap(self, flags: int) -> int | None:
        if self.returncode is None:
            try:
                info = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | flags)
            except ChildProcessError:  # reaped by someone else: status unknown
                self.returncode = -1
                return self.returncode
            if info is not None:
                self.returncode = (
                    info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
                )
        return self.returncode


@dataclass
class _Files:
    """File descriptors of the run's stdout, stderr and (optional) stdin."""

    out: int
    err: int
    stdin: int | None


class _Run:
    def __init__(
        self,
        spec: SandboxSpec,
        settings: SandboxSettings,
        caps: HostCapabilities,
        workspace: Path,
        enforcement: dict[str, Any],
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.caps = caps
        self.workspace = workspace
        self.enforcement = enforcement
        # Directories made ahead of time by the teardown thread (spare.py), if any.
        self.spare = spare.take(settings)
        self.name = self.spare.name if self.spare is not None else run_name()
        self.run_dir = settings.state_dir / "runs" / self.name
        # A spare's cgroup directories are this run's from now on (removed with it).
        self.cgroup: RunCgroup | None = (
            self.spare.cgroup if self.spare is not None else None
        )
        self.proxy: EgressProxy | None = None
        self.tmp_dir: Path | None = None
        self.shm_dir: Path | None = None
        # The compiled launcher that starts the sandbox inside its cgroups; None:
        # the runner moves the starting sandbox in itself (_join_cgroup).
        self.launcher: Path | None = None
        self.pgid = 0  # the sandbox's process group, once started

    def execute(self) -> SandboxResult:
        prepared = self.spare is not None
        files: _Files | None = None
        try:
            init = install_init(self.settings, bridge=not self.spec.network.is_none)
            self.enforcement["init"] = init.kind
            self.run_dir.mkdir(parents=True, mode=0o711, exist_ok=prepared)
            _give_workspace_to_sandbox(self.workspace, self.settings)
            if self.caps.bwrap_works:
                self.tmp_dir = self.run_dir / "tmp"
                mount_tmpfs(
                    self.tmp_dir,
                    self.spec.limits.tmpfs_mb * 1024 * 1024,
                    make_dir=not (prepared and self.tmp_dir.is_dir()),
                )
                self.shm_dir = self.run_dir / "shm"
                mount_tmpfs(
                    self.shm_dir,
                    self.spec.limits.shm_mb * 1024 * 1024,
                    make_dir=not (prepared and self.shm_dir.is_dir()),
                )
            self._create_cgroup()
            if self.cgroup is not None:
                self.launcher = install_launcher(self.settings)
            extra_binds: list[tuple[str, str]] = []
            if not self.spec.network.is_none:
                socket_path = str(self.run_dir / "proxy.sock")
                self.proxy = EgressProxy(
                    socket_path,
                    self.spec.network.allow,
                    credentials=self.spec.network.credentials,
                    resolver=self.settings.resolver,
                    allow_loopback=self.settings.allow_loopback_targets,
                    tls_context=_upstream_tls(self.settings),
                )
                self.proxy.start()
                extra_binds.append((socket_path, launch.PROXY_SOCKET_INSIDE))
            files = self._open_files()
            return self._launch_and_watch(init, extra_binds, files)
        finally:
            if files is not None:
                for fd in (files.out, files.err, files.stdin):
                    if fd is not None:
                        os.close(fd)
            if self.proxy is not None:
                self.proxy.stop()
            # Everything of the run has exited and been measured: the removal of
            # its empty cgroups, /tmp mount and run directory happens after the
            # result is returned (teardown.py), and so does the making of the next
            # run's directories (spare.py).
            teardown.defer(
                functools.partial(
                    _remove_and_prepare,
                    self.cgroup,
                    (self.tmp_dir, self.shm_dir),
                    self.run_dir,
                    self.settings,
                    self.caps,
                )
            )

    def _create_cgroup(self) -> None:
        writable = self.caps.cgroup_writable
        if not any(writable.values()):
            return
        limits = self.spec.limits
        memory_bytes = limits.memory_mb * 1024 * 1024 if limits.memory_mb else None
        if self.cgroup is not None:  # prepared: only the limits are left to write
            try:
                self.cgroup.apply_limits(memory_bytes, limits.pids, limits.cpu_quota)
            except OSError:
                # Removed or broken since it was made: start from scratch.
                self.cgroup.remove(timeout=0.1)
                self.cgroup = None
        if self.cgroup is None:
            self.cgroup = RunCgroup.create(
                self.caps.cgroup,
                self.settings.cgroup_group,
                self.name,
                memory_bytes=memory_bytes,
                pids=limits.pids,
                cpu_quota=limits.cpu_quota,
            )
        for key, value in self.cgroup.applied.items():
            self.enforcement[key] = value

    def _open_files(self) -> _Files:
        """Memory files (memfd), not pipes (OUT-1): the parent never blocks on the
        child's output. Not on disk either: creating and unlinking two files per
        run on ext4 cost ~0.3 ms here (inode allocation skips recently deleted
        inodes). Mode 0600 like the files they replace, so no other uid-65534
        process can reopen them through /proc. Written pages are charged to the
        writer's memory cgroup, as page cache was; RLIMIT_FSIZE applies as it did.
        Closed in execute()'s finally."""
        fds: list[int] = []
        try:
            for name in ("stdout", "stderr"):
                fds.append(_memfd(name))
            if self.spec.stdin_data is not None:
                fds.append(_sealed_input(self.spec.stdin_data))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return _Files(fds[0], fds[1], fds[2] if len(fds) > 2 else None)

    def _argv(
        self,
        init: InstalledInit,
        status_fd: int,
        go_fd: int | None,
        report_fd: int | None,
        extra: list[tuple[str, str]],
    ) -> list[str]:
        init_path = init.path
        limits = self.spec.limits
        config = {"status": str(status_fd), "core": "0:0"}
        if go_fd is not None:
            config["go"] = str(go_fd)
        cpu = _cpu_rlimit(limits.cpu_seconds)
        if cpu is not None:
            config["cpu"] = f"{cpu[0]}:{cpu[1]}"
        if limits.fsize_mb is not None:
            config["fsize"] = str(limits.fsize_mb * 1024 * 1024)
        if limits.nofile is not None:
            config["nofile"] = str(limits.nofile)
        as_mb = limits.effective_address_space_mb()
        if as_mb is not None:
            config["as"] = str(as_mb * 1024 * 1024)
        if self.proxy is not None:
            config["bridge"] = (
                f"{self.settings.proxy_port}:{launch.PROXY_SOCKET_INSIDE}"
            )
        uid, gid = self.settings.sandbox_uid, self.settings.sandbox_gid
        rest: list[str] = []
        if self.launcher is not None:
            assert self.cgroup is not None
            # As root the launcher also does setpriv's uid drop (see its header).
            rest += launch.launcher_argv(
                str(self.launcher),
                status_fd=status_fd,
                report_fd=report_fd,
                parent=os.getpid(),
                cgroup2=self.cgroup.v2_dir,
                tasks=self.cgroup.tasks_files,
                drop_to=(uid, gid) if self.caps.is_root else None,
            )
        if self.caps.is_root:
            if self.launcher is None:
                assert self.caps.setpriv is not None
                rest += launch.setpriv_argv(self.caps.setpriv, uid, gid)
        else:
            uid, gid = os.getuid(), os.getgid()
        if not self.caps.bwrap_works:
            # Degraded mode, allowed only when required_layers says so: no
            # namespaces, the init runs from the host path, the enforcement map
            # shows every missing layer.
            command = launch.init_argv(
                init.kind, self.settings.python, str(init_path), config, self.spec.argv
            )
            return rest + command
        command = launch.init_argv(
            init.kind,
            self.settings.python,
            launch.init_path_inside(init_path),
            config,
            self.spec.argv,
        )
        assert self.caps.bwrap is not None
        rest += launch.bwrap_argv(
            self.caps.bwrap,
            uid=uid,
            gid=gid,
            workspace=self.workspace,
            tmp_source=self.tmp_dir or Path("/nonexistent"),
            shm_source=self.shm_dir,
            extra_ro_binds=[
                (str(init_path), launch.init_path_inside(init_path)),
                *((path, path) for path in self.spec.readonly_paths),
            ],
            extra_binds=extra,
        )
        return rest + command

    def _environment(self) -> dict[str, str]:
        env = dict(_BASE_ENV)
        if not self.caps.bwrap_works:
            env["HOME"] = str(self.workspace)
        env.update(self.spec.env)
        if self.proxy is not None:
            url = f"http://127.0.0.1:{self.settings.proxy_port}"
            for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
                env[name] = url
            env["NO_PROXY"] = env["no_proxy"] = ""
        return env

    def _launch_and_watch(
        self, init: InstalledInit, extra: list[tuple[str, str]], files: _Files
    ) -> SandboxResult:
        limits = self.spec.limits
        status_r, status_w = os.pipe()
        # Without the launcher the init waits for a go byte until the runner has
        # moved it into the cgroups.
        joining = self.cgroup is not None and self.launcher is None
        go_r, go_w = os.pipe() if joining else (-1, -1)
        # With it, the launcher makes bubblewrap our own child and reports its pid.
        report_r, report_w = os.pipe() if self.launcher is not None else (-1, -1)
        started = time.monotonic()
        try:
            popen = subprocess.Popen(
                self._argv(
                    init,
                    status_w,
                    go_r if joining else None,
                    report_w if report_w >= 0 else None,
                    extra,
                ),
                stdin=files.stdin if files.stdin is not None else subprocess.DEVNULL,
                stdout=files.out,
                stderr=files.err,
                pass_fds=tuple(fd for fd in (status_w, go_r, report_w) if fd >= 0),
                close_fds=True,
                start_new_session=True,
                env=self._environment(),
                cwd="/" if self.caps.bwrap_works else str(self.workspace),
            )
        except BaseException:
            for fd in (status_r, status_w, go_r, go_w, report_r, report_w):
                if fd >= 0:
                    os.close(fd)
            raise
        os.close(status_w)
        # The new session's process group: the launcher's (or setpriv's), which
        # bubblewrap stays in.
        self.pgid = popen.pid
        proc: _Process = popen
        adopted: _Adopted | None = None
        killed_for: str | None = None
        kill_method: str | None = None
        try:
            if report_r >= 0:
                os.close(report_w)
                pid = _read_pid(report_r)
                if pid is not None:
                    adopted = _Adopted(pid)
                    proc = adopted
                # else: the launcher failed before its clone; its status says why.
            if joining:
                os.close(go_r)
                try:
                    self._join_cgroup(popen, started + limits.wall_seconds)
                    # EPIPE: bubblewrap failed before the init ran; judged below.
                    with contextlib.suppress(BrokenPipeError):
                        os.write(go_w, b"g")
                finally:
                    os.close(go_w)
            killed_for = self._watch(proc, files, started + limits.wall_seconds)
            if killed_for is not None:
                kill_method = self._kill(proc)
            try:
                proc.wait(timeout=_REAP_TIMEOUT)
            except subprocess.TimeoutExpired:
                kill_method = self._kill(proc)
                proc.wait(timeout=_REAP_TIMEOUT)
            duration_ms = int((time.monotonic() - started) * 1000)
            reap_confirmed = self._confirm_reaped()
        except BaseException:
            # Never leave a sandbox behind, whatever interrupted us.
            self._kill(proc)
            proc.wait(timeout=_REAP_TIMEOUT)
            os.close(status_r)
            raise
        finally:
            if adopted is not None:
                adopted.close()
                popen.wait()  # the launcher exited right after its report
        init_status = _read_status(status_r)
        if init_status is not None and "launch_error" in init_status:
            # The launcher could not put the sandbox into its cgroups: nothing ran.
            raise SandboxUnavailable(
                ["cgroup"], f"cannot join: {init_status['launch_error']}"
            )
        # Event counters before anything else is read or removed (CG-R1).
        counters = self.cgroup.counters() if self.cgroup is not None else {}
        if init_status is not None and "utime_ms" in init_status:
            counters["workload_cpu_ms"] = int(init_status["utime_ms"]) + int(
                init_status.get("stime_ms", 0)
            )
        if kill_method is not None:
            self.enforcement["kill_method"] = kill_method
        if self.proxy is not None:
            # Every connection ends (and is logged) before the log is read.
            self.proxy.stop()
        return self._result(
            proc, files, init_status, killed_for, counters, duration_ms, reap_confirmed
        )

    def _join_cgroup(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        """Move the starting sandbox (bwrap and the init) into the run's cgroups.

        The fallback when the compiled launcher is missing (no C compiler): each
        cgroup.procs write takes the kernel's global threadgroup rwsem, and the
        first after an idle spell waits for an RCU grace period (~7 ms here), which
        this overlaps with bubblewrap's start-up. The init spawns nothing until
        released, so the workload and everything it forks are born inside the
        cgroups; only the start-up memory of bwrap and the init stays charged
        outside. Before the release, every cgroup.procs is read back to check that
        it lists them all.
        """
        if self.cgroup is None:
            return
        moved: set[int] = set()
        while True:
            for pid in _process_tree(proc.pid):
                if pid in moved:
                    continue
                try:
                    self.cgroup.attach(pid)
                except OSError as exc:
                    if proc.poll() is not None:
                        return  # bubblewrap failed early; its stderr says why
                    raise SandboxUnavailable(["cgroup"], f"cannot join: {exc}") from exc
                moved.add(pid)
            # A fork and a cgroup migration of the forking process exclude each other
            # in the kernel (the threadgroup rwsem): a child bubblewrap forks after
            # its write is born inside, one forked before is listed by this second
            # read. So there is no need to wait for bubblewrap to fork the init.
            tree = _process_tree(proc.pid)
            if all(pid in moved for pid in tree):
                if self.cgroup.holds(tree):
                    return
                moved.clear()  # read back and not there: move them all again
            if proc.poll() is not None:
                return
            if time.monotonic() >= deadline:
                raise SandboxUnavailable(["cgroup"], "sandbox did not start in time")

    def _watch(self, proc: _Process, files: _Files, deadline: float) -> str | None:
        """Wait on a pidfd until exit, wall clock, output cap or the pids limit."""
        watch_pids = self.settings.kill_on_pids_limit and self.cgroup is not None
        if proc.returncode is not None:
            return None  # already reaped while joining the cgroup (bwrap failed)
        pidfd = os.pidfd_open(proc.pid)
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return "wall_clock"
                if poller.poll(min(remaining, _TICK_SECONDS) * 1000):
                    return None
                cause = self._between_waits(files)
                if cause is not None:
                    return cause
                if (
                    watch_pids
                    and self.cgroup is not None
                    and self.cgroup.pids_limit_hit()
                ):
                    return "pids_limit"
        finally:
            os.close(pidfd)

    def _between_waits(self, files: _Files) -> str | None:
        """Why to end the workload between two waits, if anything: its output
        over the cap (twice the bytes kept, so truncation is still seen)."""
        size = os.fstat(files.out).st_size + os.fstat(files.err).st_size
        return "output_limit" if size > 2 * self.spec.limits.output_bytes else None

    def _kill(self, proc: _Process) -> str:
        """Kill the whole tree; returns the methods used.

        First SIGKILL the init (pid 1 of the namespace): the kernel then kills every
        process in the namespace, setsid escapees included, and the init's parent,
        bubblewrap, reaps it. Killing bubblewrap at the same moment instead would
        orphan the init to the host's pid 1, which reaps lazily (§6.3 #7). The cgroup
        kill follows as the backstop for anything outside the namespace.
        """
        methods: list[str] = []
        init_pid = _first_child(proc.pid)  # proc is bubblewrap (or setpriv's exec)
        if init_pid is not None:
            try:
                os.kill(init_pid, signal.SIGKILL)
                methods.append("pidns")
                proc.wait(timeout=1.0)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if self.cgroup is not None and self.cgroup.applied.get("cgroup_kill"):
            methods.append(self.cgroup.kill())
            if init_pid is None and self.launcher is not None:
                # Killed before the sandbox had started: the launcher's process
                # group holds whatever it has spawned so far.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pgid, signal.SIGKILL)
                    methods.append("killpg")
        else:
            # Without cgroup.kill: SIGKILL bubblewrap; --die-with-parent takes the
            # init and with it every process inside.
            try:
                os.killpg(self.pgid, signal.SIGKILL)
                methods.append("killpg")
            except ProcessLookupError:
                pass
            if self.cgroup is not None:
                methods.append(self.cgroup.kill())
        return "+".join(methods)

    def _confirm_reaped(self) -> bool:
        if self.cgroup is None:
            return False  # nothing can confirm descendants are gone
        if self.cgroup.wait_empty(2.0):
            return True
        self.cgroup.kill()
        return self.cgroup.wait_empty(2.0)

    def _result(
        self,
        proc: _Process,
        files: _Files,
        init_status: dict[str, Any] | None,
        killed_for: str | None,
        counters: dict[str, int],
        duration_ms: int,
        reap_confirmed: bool,
    ) -> SandboxResult:
        limits = self.spec.limits
        cap = limits.output_bytes
        stdout, out_bytes = _read_capped(files.out, cap)
        stderr, err_bytes = _read_capped(files.err, cap)
        cpu = _cpu_rlimit(limits.cpu_seconds)
        cpu_hard = cpu[1] if cpu is not None else None
        extra: list[str] = []
        full: list[str] = []
        for mount, inside in ((self.tmp_dir, "/tmp"), (self.shm_dir, "/dev/shm")):
            if mount is None:
                continue
            tmp = tmpfs_usage(mount, walk_below=DISK_FULL_BYTES, inside=inside)
            if tmp.avail_bytes < DISK_FULL_BYTES:
                biggest = ", ".join(f"{p} {n} bytes" for p, n in tmp.largest)
                full.append(f"{inside} ({tmp.size_bytes} bytes; largest: {biggest})")
        ws = os.statvfs(self.workspace)
        if ws.f_bavail * ws.f_frsize < DISK_FULL_BYTES:
            full.append(f"/workspace ({ws.f_blocks * ws.f_frsize} bytes)")
        verdict = judge(
            Observation(
                init_status=init_status,
                launcher_returncode=proc.returncode,
                killed_for=killed_for,
                counters=counters,
                cpu_hard_seconds=cpu_hard,
                output_cap=cap,
                out_bytes=out_bytes,
                err_bytes=err_bytes,
                full_filesystems=full,
                launcher_stderr_tail=stderr[-300:] if init_status is None else "",
                extra_detail=extra,
            )
        )
        maxrss = init_status.get("maxrss_kb") if init_status else None
        return SandboxResult(
            ok=verdict.ok,
            exit_code=verdict.status.exit_code,
            signal=verdict.status.signal,
            signal_name=verdict.status.signal_name,
            timed_out=verdict.timed_out,
            termination_cause=verdict.cause,
            output_limited=verdict.output_limited,
            stdout=stdout,
            stderr=stderr,
            stdout_truncated=out_bytes > cap,
            stderr_truncated=err_bytes > cap,
            bytes={"stdout": out_bytes, "stderr": err_bytes},
            duration_ms=duration_ms,
            max_rss_kb=int(maxrss) if maxrss is not None else None,
            error=verdict.error,
            detail=verdict.detail,
            enforcement=self.enforcement,
            reap_confirmed=reap_confirmed,
            core_dumped=verdict.status.core_dumped,
            retryable=False,
            counters=counters,
            network_log=list(self.proxy.log) if self.proxy is not None else [],
            network_counts=dict(self.proxy.counts) if self.proxy is not None else {},
        )


def _enforcement(
    caps: HostCapabilities,
    planned: dict[str, bool],
    spec: SandboxSpec,
    settings: SandboxSettings,
    workspace: Path,
) -> dict[str, Any]:
    """The layers this run gets; cgroup entries are confirmed once the cgroup exists."""
    limits = spec.limits
    as_mb = limits.effective_address_space_mb()
    ns = planned["bwrap"]
    return {
        "bwrap": ns,
        "bwrap_version": caps.bwrap_version,
        "userns": ns,
        "pidns": ns,
        "netns": ns,
        "mountns": ns,
        "ipcns": ns,
        "utsns": ns,
        # bubblewrap's own / and /dev are remounted read-only: what the workload
        # can write is exactly these mounts, and the noexec ones cannot run files.
        "readonly_root": ns,
        "writable_paths": ["/workspace", "/tmp", "/dev/shm"] if ns else None,
        "noexec_paths": ["/tmp", "/dev/shm"] if ns else [],
        "tmpfs_size": ns,
        "tmp_noexec": ns,
        "workspace_size": workspace_size(workspace),
        # "c" or "python"; set again to the init really installed.
        "init": planned_init_kind(settings, bridge=not spec.network.is_none),
        "workload_not_pid1": ns,
        "uid_drop": planned["uid_drop"],
        "no_new_privs": planned["no_new_privs"],
        "cap_drop": ns,
        # Requested values; the init refuses to run the workload if any of them
        # cannot be applied, so a result with a workload status had all of them.
        "rlimits": {
            "core": 0,
            "cpu_seconds": _cpu_rlimit(limits.cpu_seconds),
            "fsize_bytes": limits.fsize_mb * 1024 * 1024 if limits.fsize_mb else None,
            "nofile": limits.nofile,
            "as_bytes": as_mb * 1024 * 1024 if as_mb else None,
        },
        "cgroup": caps.cgroup.mode,
        "cgroup_kill": False,
        "memory_limit": False,
        "oom_group": False,
        "pids_limit": False,
        "cpu_quota": False,
        "network": "none" if spec.network.is_none else "proxy",
        "egress_filter": False,  # no nftables rule; the netns has no route but lo
        "seccomp": False,
        "landlock": False,
    }


def _refused(refused: PathRefused, enforcement: dict[str, Any]) -> SandboxResult:
    return SandboxResult(
        ok=False,
        exit_code=None,
        signal=None,
        signal_name=None,
        timed_out=False,
        termination_cause="path_refused",
        output_limited=False,
        stdout="",
        stderr="",
        stdout_truncated=False,
        stderr_truncated=False,
        bytes={"stdout": 0, "stderr": 0},
        duration_ms=0,
        max_rss_kb=None,
        error="EPATH",
        detail=refused.detail,
        enforcement=enforcement,
        reap_confirmed=True,  # nothing was spawned
    )


def _upstream_tls(settings: SandboxSettings) -> ssl.SSLContext | None:
    """The context the proxy verifies upstream TLS with: the operator's CA file, or
    None for the system CAs (made on first use)."""
    if not settings.egress_ca_file:
        return None
    return ssl.create_default_context(cafile=settings.egress_ca_file)


def _remove_and_prepare(
    cgroup: RunCgroup | None,
    mounts: tuple[Path | None, ...],
    run_dir: Path,
    settings: SandboxSettings,
    caps: HostCapabilities,
) -> None:
    """On the teardown thread: remove a finished run, make the next one's dirs."""
    if cgroup is not None:
        cgroup.remove()
    for mount in mounts:
        if mount is not None:
            unmount_tmpfs(mount)
    shutil.rmtree(run_dir, ignore_errors=True)
    spare.prepare(settings, caps)


def _give_workspace_to_sandbox(workspace: Path, settings: SandboxSettings) -> None:
    """The sandbox uid must own the workspace to write in it; lchown never follows a
    symlink an earlier run may have planted."""
    if os.geteuid() != 0:
        return
    uid, gid = settings.sandbox_uid, settings.sandbox_gid
    for dirpath, dirnames, filenames in os.walk(workspace):
        for name in [".", *dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if st.st_uid != uid or st.st_gid != gid:
                os.lchown(path, uid, gid)


def _cpu_rlimit(cpu_seconds: float | None) -> list[int] | None:
    """RLIMIT_CPU (soft, hard): whole seconds, hard one second later (SIGKILL)."""
    if cpu_seconds is None:
        return None
    soft = max(1, math.ceil(cpu_seconds))
    return [soft, soft + 1]


def _memfd(name: str, flags: int = 0) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC | flags)
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _sealed_input(data: bytes) -> int:
    """A read-only fd on a sealed memfd holding `data` (the workload's stdin)."""
    fd = _memfd("stdin", os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(
            fd,
            fcntl.F_ADD_SEALS,
            fcntl.F_SEAL_SEAL
            | fcntl.F_SEAL_SHRINK
            | fcntl.F_SEAL_GROW
            | fcntl.F_SEAL_WRITE,
        )
        # A fresh read-only open file description, at offset 0.
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(fd)


def _process_tree(pid: int) -> list[int]:
    """`pid` and its descendants, parents first."""
    tree = [pid]
    for parent in tree:
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as f:
                tree.extend(int(child) for child in f.read().split())
        except OSError:
            continue
    return tree


def _read_pid(fd: int) -> int | None:
    """The pid the launcher reports (one line), or None at EOF without one."""
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = os.read(fd, 32)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    try:
        return int(data)
    except ValueError:
        return None


def _first_child(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = f.read().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _read_status(fd: int) -> dict[str, Any] | None:
    import json

    os.set_blocking(fd, False)
    chunks = []
    try:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    except BlockingIOError:
        pass  # a writer survived somewhere; what we have is what we use
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if not data:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _read_capped(fd: int, cap: int) -> tuple[str, int]:
    size = os.fstat(fd).st_size
    chunks: list[bytes] = []
    got = 0
    while got < min(cap, size):
        chunk = os.pread(fd, min(cap, size) - got, got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace"), size
