"""`manage.py dev` (what `make run` calls) brings everything up and leaves nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from controlplane.embedded_redis import free_local_port

BASE_DIR = Path(__file__).resolve().parents[2]


def descendants(pid: int) -> set[int]:
    """Every live process whose ancestry reaches `pid` (read from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        children = {child for child, parent in parents.items() if parent in frontier}
        frontier = children - found
        found |= children
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_dev_launcher_becomes_healthy_and_stops_every_child(tmp_path):
    port = free_local_port()
    environ = {
        k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL"}
    }
    environ.update(
        DATABASE_URL=f"sqlite:///{tmp_path / 'dev.sqlite3'}",
        DEMO_PASSWORD="launcher-test-pw",
        PYTHONUNBUFFERED="1",
    )
    log = (tmp_path / "dev.log").open("w+")
    launcher = subprocess.Popen(
        [sys.executable, "manage.py", "dev", "--port", str(port)],
        cwd=BASE_DIR, env=environ, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        body = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and body is None:
            assert launcher.poll() is None, (tmp_path / "dev.log").read_text()
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/healthz", timeout=3
                ) as response:
                    body = json.loads(response.read())
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        assert body == {"database": "ok", "redis": "ok", "worker": "ok", "status": "ok"}
        children = descendants(launcher.pid)
        assert len(children) >= 4  # redis, daphne, worker (+ pool), beat
        while "Ready: " not in (tmp_path / "dev.log").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(60)
    output = (tmp_path / "dev.log").read_text()
    assert f"Ready: http://127.0.0.1:{port}/" in output
    assert "users admin, operator, viewer" in output
    for prefix in ("   web | ", "worker | ", "  beat | ", " redis | "):
        assert prefix in output
    time.sleep(0.5)
    assert [pid for pid in children if alive(pid)] == []


def test_signals_stop_the_supervisor_loop_even_in_a_storm(tmp_path):
    """SIGTERM ends `run_until_stopped` whatever the main thread was doing: the
    handler only sets a flag (an Event.set() there once deadlocked `make run` when
    the signal landed while the loop held the Event's lock)."""
    import io
    import threading

    from controlplane.launcher import Launcher, install_stop_handlers

    launcher = Launcher(
        base_dir=tmp_path, host="127.0.0.1", port=free_local_port(),
        redis_url="redis://unused", worker_concurrency=1, out=io.StringIO(),
    )  # fmt: skip
    launcher.children = []  # nothing to supervise: only the loop and the signals
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    install_stop_handlers(launcher.request_stop)

    def storm() -> None:
        for _ in range(200):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.0005)

    try:
        sender = threading.Thread(target=storm)
        started = time.monotonic()
        sender.start()
        launcher.run_until_stopped()
        sender.join()
        assert launcher.stop_requested
        assert time.monotonic() - started < 5
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
