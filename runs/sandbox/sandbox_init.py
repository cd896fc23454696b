"""The tiny init that runs inside the sandbox as pid 1 of its pid namespace.

The compiled C port, `sandbox_init.c`, is used instead whenever a C compiler exists and
the run needs no network bridge (see init_install.py); the two must stay in step.

It is executed by the system interpreter as `python3 -S -E -I -B sandbox_init.py CONFIG
-- ARGV...`, so it must stay stdlib-only and cheap to start: it imports only os, sys
and resource (plus socket/select in proxy mode) and writes its status record by hand
instead of importing json.

Why it exists (spec §6.3): a workload that is pid 1 of a pid namespace ignores
SIGXCPU and every other default-action signal, and a CLI wrapper's exit code loses
the difference between "exit 137" and "killed by SIGKILL". So this init applies the
rlimits, spawns the workload as pid 2, reaps every orphan, waitid()s the workload and
reports the decoded status out-of-band on a pipe the runner reads. When the init
exits, the kernel kills whatever is left in the namespace.
"""

from __future__ import annotations

import os
import resource
import sys

# Signal numbers are the generic Linux ones; importing `signal` would pull in enum
# and cost a millisecond of every run.
_SIGPIPE = 13
_SIGXFSZ = 25


def _parse_config(text: str) -> dict[str, str]:
    config: dict[str, str] = {}
    for item in text.split(","):
        if item:
            key, _, value = item.partition("=")
            config[key] = value
    return config


def _apply_rlimits(config: dict[str, str]) -> None:
    # Set in the init itself before spawning: rlimits are inherited, RLIMIT_CPU is
    # counted per process, and the init uses almost no CPU or memory of its own.
    pairs = (
        ("core", resource.RLIMIT_CORE),
        ("cpu", resource.RLIMIT_CPU),
        ("fsize", resource.RLIMIT_FSIZE),
        ("nofile", resource.RLIMIT_NOFILE),
        ("as", resource.RLIMIT_AS),
    )
    for key, which in pairs:
        value = config.get(key)
        if value:
            soft, _, hard = value.partition(":")
            resource.setrlimit(which, (int(soft), int(hard or soft)))


def _close_inherited_fds(keep: set[int]) -> None:
    """Make every fd above 2 close-on-exec so the workload sees only 0, 1, 2 (FS-11)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            # contextlib.suppress would cost an import on every run's startup.
            try:  # noqa: SIM105
                os.set_inheritable(fd, False)
            except OSError:
                pass  # the fd of the listdir itself is already closed


def _start_bridge(port: int, socket_path: str) -> int:
    """Fork a process that forwards 127.0.0.1:port in this netns to the proxy socket."""
    import select
    import socket

    def pump(a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        open_ends = {a, b}
        while open_ends:
            readable, _, _ = select.select(list(open_ends), [], [])
            for sock in readable:
                data = sock.recv(65536)
                if data:
                    peers[sock].sendall(data)
                    continue
                open_ends.discard(sock)
                try:  # noqa: SIM105 (no contextlib import in the init)
                    peers[sock].shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    pid = os.fork()
    if pid:
        listener.close()  # the workload must not be able to accept on it
        return pid
    try:
        while True:
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    upstream.connect(socket_path)
                    pump(conn, upstream)
                finally:
                    os._exit(0)
            conn.close()
            # Reap finished forwarders without blocking the accept loop.
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                pass
    finally:
        os._exit(0)


def main(argv: list[str]) -> int:
    config = _parse_config(argv[1])
    command = argv[3:]  # argv[2] is "--"
    status_fd = int(config["status"])
    record: dict[str, int | str] = {}
    go = config.get("go")
    if go:
        # The runner moves this process into the run's cgroups while the interpreter
        # starts up, then releases it; nothing is spawned before that (EOF: the
        # runner gave up, so nothing runs at all).
        if os.read(int(go), 1) != b"g":
            return 2
        os.close(int(go))
    try:
        _apply_rlimits(config)
        if config.get("bridge"):
            port, _, socket_path = config["bridge"].partition(":")
            _start_bridge(int(port), socket_path)
    except (OSError, ValueError) as exc:
        # Fail closed: a workload never runs with a limit silently missing.
        record["setup_error"] = str(exc)
        os.write(status_fd, _encode(record).encode())
        return 1
    _close_inherited_fds(keep=set())
    try:
        # posix_spawn (vfork underneath) rather than fork: cheaper, and setsigdef
        # undoes Python's SIG_IGN of SIGPIPE/SIGXFSZ, which exec would otherwise keep.
        child = os.posix_spawnp(
            command[0], command, dict(os.environ), setsigdef=(_SIGPIPE, _SIGXFSZ)
        )
    except OSError as exc:
        record["spawn_errno"] = exc.errno or 0
        record["spawn_error"] = exc.strerror or "spawn failed"
        child = 0
    record["pid"] = child
    while child:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            break
        if info is None:
            continue
        if info.si_pid != child:
            os.waitpid(info.si_pid, 0)  # an orphan re-parented to us: reap it
            continue
        record["si_code"] = info.si_code
        record["si_status"] = info.si_status
        _, _, usage = os.wait4(child, 0)
        record["utime_ms"] = int(usage.ru_utime * 1000)
        record["stime_ms"] = int(usage.ru_stime * 1000)
        record["maxrss_kb"] = usage.ru_maxrss
        break
    os.write(status_fd, _encode(record).encode())
    return 0


def _encode(record: dict[str, int | str]) -> str:
    parts = []
    for key, value in record.items():
        if isinstance(value, int):
            parts.append(f'"{key}":{value}')
        else:
            clean = "".join(ch for ch in value if ch.isalnum() or ch in " .,:-_")
            parts.append(f'"{key}":"{clean}"')
    return "{" + ",".join(parts) + "}"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
