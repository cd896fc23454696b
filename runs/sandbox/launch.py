"""The command line that starts one sandbox: uid drop, bubblewrap, init.

No `preexec_fn` anywhere: the runner lives in Celery prefork children with
OpenTelemetry threads, where running Python between fork and exec can deadlock. The
work that must happen between fork and exec is done by small separate programs:

0. `sandbox_launch` (compiled C, where a compiler exists) starts what follows
   inside the run's cgroups, without the global lock a cgroup.procs write takes,
   and does step 1 itself with the same syscalls;
1. `setpriv` drops to the sandbox uid/gid, clears groups and inheritable
   capabilities and sets no_new_privs;
2. `bwrap` (unprivileged, in a new user namespace) builds the namespaces and mounts;
3. `sandbox_init` (pid 1 inside; compiled C, or Python for a network bridge) waits
   until the runner has moved it into the run's cgroups, applies rlimits and spawns
   the workload as pid 2.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

PROXY_SOCKET_INSIDE = "/run/sandbox/proxy.sock"
WORKSPACE_INSIDE = "/workspace"
_SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def system_mounts() -> list[str]:
    """Read-only system: /usr and /etc, plus the merged-/usr links of this host."""
    return list(_system_mounts())


@functools.cache
def _system_mounts() -> tuple[str, ...]:
    # The host's / layout is looked at once per process, not once per run.
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for name in _SYSTEM_DIRS:
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    return tuple(args)


def bwrap_argv(
    bwrap: str,
    *,
    uid: int,
    gid: int,
    workspace: Path,
    tmp_source: Path,
    shm_source: Path | None = None,
    extra_ro_binds: Sequence[tuple[str, str]] = (),
    extra_binds: Sequence[tuple[str, str]] = (),
) -> list[str]:
    """bubblewrap up to (not including) the command; shared with the benchmark."""
    args = [
        bwrap,
        "--unshare-all",  # user, ipc, pid, net, uts, cgroup
        "--unshare-user",
        "--disable-userns",  # no nested user namespaces for the workload
        "--uid", str(uid),
        "--gid", str(gid),
        "--hostname", "sandbox",
        *system_mounts(),
        "--proc", "/proc",
        "--dev", "/dev",
        "--bind", str(tmp_source), "/tmp",  # the runner's noexec, sized tmpfs
        "--bind", str(workspace), WORKSPACE_INSIDE,
    ]  # fmt: skip
    for src, dest in extra_ro_binds:
        args += ["--ro-bind", src, dest]
    for src, dest in extra_binds:
        args += ["--bind", src, dest]
    if shm_source is not None:
        # The runner's noexec, sized tmpfs, like /tmp (bwrap's own /dev/shm is a
        # directory of its /dev tmpfs: unbounded and executable).
        args += ["--bind", str(shm_source), "/dev/shm"]
    # Last of the mounts: bubblewrap's root and /dev are tmpfs of its own, writable
    # and executable (/, /run, /dev/shm without a bind). Read-only from here on;
    # non-recursive, so /tmp, /dev/shm, /workspace and the devices stay as bound.
    args += ["--remount-ro", "/dev", "--remount-ro", "/"]
    args += [
        "--chdir", WORKSPACE_INSIDE,
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",  # our init is pid 1; the workload is pid 2 (§6.3 #1)
        "--cap-drop", "ALL",
    ]  # fmt: skip
    return args


def launcher_argv(
    launcher: str,
    *,
    status_fd: int,
    parent: int,
    cgroup2: Path | None,
    tasks: Sequence[str],
    drop_to: tuple[int, int] | None,
    report_fd: int | None = None,
) -> list[str]:
    """The compiled launcher (sandbox_launch.c): it starts the rest of the command
    line inside the run's cgroups, cloned into `cgroup2` and joined to each v1
    `tasks` file, then (as root) drops to `drop_to` (uid, gid) exactly as
    setpriv_argv() does, before exec. With `report_fd` the child is made the
    caller's own child and its pid is written there."""
    args = [launcher, "--status", str(status_fd), "--parent", str(parent)]
    if report_fd is not None:
        args += ["--report", str(report_fd)]
    if cgroup2 is not None:
        args += ["--cgroup2", str(cgroup2)]
    for path in tasks:
        args += ["--tasks", path]
    if drop_to is not None:
        args += ["--uid", str(drop_to[0]), "--gid", str(drop_to[1])]
    return [*args, "--"]


def setpriv_argv(setpriv: str, uid: int, gid: int) -> list[str]:
    return [
        setpriv,
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
    ]


def init_path_inside(installed: Path) -> str:
    """Where the init appears inside; the suffix tells Python whether it is a .pyc
    (the compiled C init has none)."""
    return f"/run/sandbox/init{installed.suffix}"


def init_argv(
    kind: str,
    python: str,
    init_path: str,
    config: dict[str, str],
    command: Sequence[str],
) -> list[str]:
    encoded = ",".join(f"{k}={v}" for k, v in config.items())
    if kind == "c":
        return [init_path, encoded, "--", *command]
    # -S no site, -E/-I ignore PYTHON* and user site, -B no .pyc writes: the init must
    # start fast and must not be steerable by the workload's environment.
    return [python, "-S", "-E", "-I", "-B", init_path, encoded, "--", *command]
