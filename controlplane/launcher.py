"""The dev launcher behind `make run`: one command that starts and supervises
Daphne, a Celery worker, Celery beat, (when REDIS_URL is empty) an embedded Redis
and any `extra` children the caller adds (the demo's local model server).

Each child gets its own process group so that stopping kills the whole tree (the
worker's pool processes included) and Ctrl-C in the terminal reaches only us.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from controlplane.embedded_redis import (
    EmbeddedRedis,
    die_with_parent,
    publish,
    published_path,
    unpublish,
)

MAX_RESTARTS = 5
STOP_GRACE_SECONDS = 10.0


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    pump: threading.Thread | None = field(default=None, repr=False)


class Launcher:
    def __init__(
        self,
        *,
        base_dir: Path,
        host: str,
        port: int,
        redis_url: str,
        worker_concurrency: int,
        out: IO[str],
        extra: Sequence[tuple[str, list[str]]] = (),
    ) -> None:
        self.base_dir = base_dir
        self.host = host
        self.port = port
        self.redis_url = redis_url
        self.out = out
        self.out_lock = threading.Lock()
        # A plain flag, not a threading.Event: a signal handler sets it, and
        # Event.set() takes a lock that the interrupted main thread may hold
        # (inside Event.wait), which deadlocked `make run` on SIGTERM.
        self.stop_requested = False
        self.redis: EmbeddedRedis | None = None
        python = sys.executable
        self.children = [
            Child(
                "web",
                [python, "-m", "daphne", "-b", host, "-p", str(port),
                 "controlplane.asgi:application"],
            ),
            Child(
                "worker",
                [python, "-m", "celery", "-A", "controlplane", "worker",
                 "-l", "INFO", "--concurrency", str(worker_concurrency),
                 "-n", f"worker-{os.getpid()}@%h"],
            ),
            Child(
                "beat",
                [python, "-m", "celery", "-A", "controlplane", "beat", "-l", "INFO",
                 "-s", str(base_dir / ".run" / "celerybeat-schedule")],
            ),
        ]  # fmt: skip
        self.children += [Child(name, argv) for name, argv in extra]

    @property
    def published_redis(self) -> Path:
        return published_path(self.base_dir)

    def say(self, name: str, line: str) -> None:
        with self.out_lock:
            self.out.write(f"{name:>6} | {line}\n")
            self.out.flush()

    def _pump(self, name: str, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            self.say(name, raw.decode("utf-8", "replace").rstrip())
        stream.close()

    def _environment(self) -> dict[str, str]:
        environ = dict(os.environ)
        environ["REDIS_URL"] = self.redis_url
        environ["PYTHONUNBUFFERED"] = "1"
        # web, worker and beat record metrics into one directory (GET /metrics).
        environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(self.metrics_dir))
        return environ

    def _spawn(self, child: Child) -> None:
        child.process = subprocess.Popen(
            child.argv,
            cwd=self.base_dir,
            env=self._environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        assert child.process.stdout is not None
        child.pump = threading.Thread(
            target=self._pump, args=(child.name, child.process.stdout), daemon=True
        )
        child.pump.start()
        self.say("dev", f"started {child.name} (pid {child.process.pid})")

    @property
    def metrics_dir(self) -> Path:
        return self.base_dir / ".run" / "metrics"

    def start(self) -> None:
        # Counters start from zero with each `make run` (files of dead processes
        # would otherwise be added to the new ones').
        shutil.rmtree(self.metrics_dir, ignore_errors=True)
        self.metrics_dir.mkdir(parents=True)
        if not self.redis_url:
            self.redis = EmbeddedRedis(self.base_dir / ".run" / "redis")
            process = self.redis.start(stdout=subprocess.PIPE)
            assert process.stdout is not None
            threading.Thread(
                target=self._pump, args=("redis", process.stdout), daemon=True
            ).start()
            self.redis_url = self.redis.url
            publish(self.published_redis, self.redis_url)
            self.say("dev", f"embedded Redis at {self.redis_url} (pid {process.pid})")
        for child in self.children:
            self._spawn(child)

    def wait_healthy(self, timeout: float) -> tuple[bool, str]:
        url = f"http://{self.host}:{self.port}/healthz"
        deadline = time.monotonic() + timeout
        body = "no answer"
        while time.monotonic() < deadline and not self.stop_requested:
            try:
                with urllib.request.urlopen(url, timeout=3) as response:
                    return True, response.read().decode()
            except urllib.error.HTTPError as exc:
                body = exc.read().decode()
            except (urllib.error.URLError, OSError) as exc:
                body = str(exc)
            self.supervise_once()
            time.sleep(0.5)
        return False, body

    def supervise_once(self) -> None:
        for child in self.children:
            if self.stop_requested or child.process is None:
                return
            code = child.process.poll()
            if code is None:
                continue
            if child.restarts >= MAX_RESTARTS:
                self.say("dev", f"{child.name} exited ({code}) too often; stopping")
                self.stop_requested = True
                return
            child.restarts += 1
            self.say("dev", f"{child.name} exited ({code}); restarting")
            _kill_group(child.process, signal.SIGKILL)  # leftovers of its tree
            self._spawn(child)

    def request_stop(self) -> None:
        """Safe in a signal handler: it takes no lock."""
        self.stop_requested = True

    def run_until_stopped(self) -> None:
        while not self.stop_requested:
            self.supervise_once()
            time.sleep(0.5)  # so a stop signal is seen within half a second

    def stop(self) -> None:
        self.stop_requested = True
        for child in reversed(self.children):
            if child.process is not None and child.process.poll() is None:
                self.say("dev", f"stopping {child.name}")
                _kill_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in self.children:
            if child.process is None:
                continue
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say("dev", f"{child.name} did not stop in time; killing it")
            # The group may hold pool processes even after the leader exited.
            _kill_group(child.process, signal.SIGKILL)
            child.process.wait()
        if self.redis is not None:
            unpublish(self.published_redis)
            self.redis.stop()
        self.say("dev", "stopped every process")


def _kill_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def install_stop_handlers(stop: Callable[[], None]) -> None:
    """SIGINT and SIGTERM call `stop`, which must take no lock (see
    `Launcher.request_stop`)."""

    def handler(signum: int, frame: object) -> None:
        stop()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
