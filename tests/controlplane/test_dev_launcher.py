"""`manage.py dev` (what `make run` calls) brings everything up and leaves nothing."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

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
    grpc_port = free_local_port()
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
        [sys.executable, "manage.py", "dev", "--port", str(port),
         "--otlp-grpc-port", str(grpc_port)],
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
        # The OTLP/gRPC receiver it started takes a span with a tenant token.
        token = subprocess.run(
            [sys.executable, "manage.py", "issue_token",
             "--tenant", "kettlecraft", "--user", "operator"],
            cwd=BASE_DIR, env=environ, capture_output=True, text=True, check=True,
        ).stdout.strip().splitlines()[-1]  # fmt: skip
        assert export_one_span_over_grpc(grpc_port, token) == SpanExportResult.SUCCESS
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(60)
    output = (tmp_path / "dev.log").read_text()
    assert f"Ready: http://127.0.0.1:{port}/" in output
    assert f"127.0.0.1:{grpc_port} (gRPC)" in output
    assert f"OTLP/gRPC receiver listening on 127.0.0.1:{grpc_port}" in output
    assert "users admin, operator, viewer" in output
    # The second demo agent, seeded through the API, and its model server.
    assert "Agents: kettlecraft-support" in output
    assert "kettlecraft-warranty (local OpenAI-compatible model, MCP tool)" in output
    # The demo's eval suite, its judge at that model server.
    assert "Demo: eval suite kettlecraft (judge endpoint kettlecraft-judge at " in (
        output
    )
    for prefix in ("   web | ", "worker | ", "  beat | ", " redis | ", " model | ",
                   "  otlp | "):  # fmt: skip
        assert prefix in output
    time.sleep(0.5)
    assert [pid for pid in children if alive(pid)] == []


def export_one_span_over_grpc(port: int, token: str) -> SpanExportResult:
    exporter = OTLPSpanExporter(
        endpoint=f"127.0.0.1:{port}",
        insecure=True,
        headers=(("authorization", f"Bearer {token}"),),
    )
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    with provider.get_tracer("launcher-test").start_as_current_span("hello"):
        pass
    try:
        return exporter.export(spans.get_finished_spans())
    finally:
        exporter.shutdown()


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


def read_until(
    process: subprocess.Popen[str], prefix: str, timeout: float
) -> list[str]:
    """The process's output lines up to the first that starts with `prefix`, or
    what came before `timeout` (the process is then killed).

    It reads the pipe's raw bytes: a `readline()` of the text wrapper could take
    two lines from the pipe at once and keep the second in its buffer, where
    `select` never sees it (the run's last lines came together on a loaded box,
    and the test waited its whole timeout for a line it had already read)."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    pending = b""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        pending += chunk
        while b"\n" in pending:
            raw, pending = pending.split(b"\n", 1)
            lines.append(raw.decode() + "\n")
            if lines[-1].startswith(prefix):
                return lines
    process.kill()
    return lines


def test_the_readme_cli_beside_make_run_reaches_its_workers_every_time(tmp_path):
    """A second shell's `manage.py run_agent ... --wait` (no REDIS_URL) finds the
    embedded Redis of the running `manage.py dev`, a worker takes the run from the
    queue (recovery never re-enqueues a lost step), and the approved demo succeeds
    three times in a row on one database. The OTLP/gRPC port is taken by another
    collector: it comes up without its gRPC receiver and says so."""
    port = free_local_port()
    collector = socket.socket()
    collector.bind(("127.0.0.1", 0))
    collector.listen()
    taken = collector.getsockname()[1]
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
        [sys.executable, "manage.py", "dev", "--port", str(port),
         "--otlp-grpc-port", str(taken)],
        cwd=BASE_DIR, env=environ, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    published = BASE_DIR / ".run" / "redis.json"

    def launcher_log() -> str:
        return (tmp_path / "dev.log").read_text()[-6000:]

    try:
        deadline = time.monotonic() + 120
        while "Ready: " not in (tmp_path / "dev.log").read_text():
            assert launcher.poll() is None, (tmp_path / "dev.log").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert json.loads(published.read_text())["pid"] == launcher.pid
        started = (tmp_path / "dev.log").read_text()
        assert f"OTLP/gRPC: 127.0.0.1:{taken} is in use" in started
        assert "(gRPC)" not in started and "  otlp | " not in started
        token = subprocess.run(
            [sys.executable, "manage.py", "issue_token",
             "--tenant", "kettlecraft", "--user", "operator"],
            cwd=BASE_DIR, env=environ, capture_output=True, text=True, check=True,
        ).stdout.strip().splitlines()[-1]  # fmt: skip
        for attempt in range(3):
            cli = subprocess.Popen(
                [sys.executable, "manage.py", "run_agent", "kettlecraft-support",
                 "--input", "Order 4821 arrived damaged", "--wait", "--timeout", "240"],
                cwd=BASE_DIR, env=environ, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            # Generous: a loaded two-core CI box starts the first step slowly; that
            # no step went through recovery is asserted from the log below.
            lines = read_until(cli, "waiting for approval ", timeout=90)
            assert lines and lines[-1].startswith("waiting for approval "), (
                lines,
                launcher_log(),
            )
            approval_id = lines[-1].split()[3]
            assert lines[-1].strip().endswith("of create_replacement"), lines
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/api/v1/approvals/{approval_id}/decide/",
                data=json.dumps({"decision": "approve"}).encode(),
                headers={"Authorization": f"Bearer {token}",
                         "Content-Type": "application/json"},
                method="POST",
            )  # fmt: skip
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200
            try:
                rest, _ = cli.communicate(timeout=150)
            except subprocess.TimeoutExpired:
                cli.kill()
                raise AssertionError((attempt, lines, launcher_log())) from None
            assert cli.returncode == 0, (attempt, "".join(lines) + rest, launcher_log())
            assert " succeeded: stop_reason=done" in rest
        # The API-defined agent: its local model server and its MCP stdio tool.
        warranty = subprocess.run(
            [sys.executable, "manage.py", "run_agent", "kettlecraft-warranty",
             "--input", "Is order 4821 under warranty?", "--wait", "--timeout", "180"],
            cwd=BASE_DIR, env=environ, capture_output=True, text=True, timeout=200,
        )  # fmt: skip
        assert warranty.returncode == 0, (warranty.stdout, launcher_log())
        assert " succeeded: stop_reason=done" in warranty.stdout
        assert "its step was lost; enqueued it again" not in launcher_log()
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(60)
        collector.close()
    assert not published.exists()  # a stopped launcher leaves no stale URL


def test_the_cli_says_clearly_that_nothing_is_running(db, tenant):
    """With no Redis to reach, `run_agent` refuses before writing anything."""
    from django.core.management import CommandError, call_command

    from controlplane.celery import app as celery_app
    from runs.demo import demo_seed_shop
    from runs.models import Run

    demo_seed_shop(tenant=tenant)
    broker = celery_app.conf.broker_url
    celery_app.conf.broker_url = f"redis://127.0.0.1:{free_local_port()}/0"
    try:
        with pytest.raises(CommandError, match="Nothing is running: no Redis at"):
            call_command(
                "run_agent", "kettlecraft-support", "--input", "hello", "--wait"
            )
    finally:
        celery_app.conf.broker_url = broker
    assert Run.objects.count() == 0
