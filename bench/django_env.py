"""Set up Django for a benchmark process: its own database and a real Redis."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def django_setup(database_url: str | None = None) -> str:
    """Point this process at `database_url` (a fresh SQLite file by default) and a
    Redis (REDIS_URL, else an embedded one), migrate, and return the database URL."""
    if database_url is None:
        database_url = f"sqlite:///{tempfile.mkdtemp(prefix='cp-bench-')}/bench.sqlite3"
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ["CELERY_QUEUE"] = f"bench-{uuid.uuid4().hex[:8]}"
    os.environ["LOG_LEVEL"] = "WARNING"
    # Production settings: DEBUG off (no query log), as a deployment runs.
    os.environ["DEBUG"] = "false"
    os.environ.setdefault("SECRET_KEY", "bench-" + uuid.uuid4().hex * 2)
    os.environ.setdefault("SECURE_COOKIES", "false")  # plain HTTP on loopback
    if not os.environ.get("REDIS_URL"):
        from controlplane.embedded_redis import EmbeddedRedis

        redis = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="cp-bench-redis-")))
        redis.start(stdout=subprocess.DEVNULL)
        atexit.register(redis.stop)
        os.environ["REDIS_URL"] = redis.url
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    return database_url


class Workers:
    """N real `celery worker` processes (concurrency 1 each) on this database,
    taking steps from `queue` (CELERY_QUEUE by default); the steps they enqueue
    go to the same queue."""

    def __init__(
        self, count: int, *, pool: str = "prefork", queue: str | None = None
    ) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        self.log = tempfile.NamedTemporaryFile(prefix="cp-bench-worker-")  # noqa: SIM115
        from controlplane.celery import app

        names = []
        environ = dict(os.environ)
        if queue is not None:
            environ["CELERY_QUEUE"] = queue
        self.queue = environ.get("CELERY_QUEUE", "")
        for index in range(count):
            name = f"bench-{index}-{uuid.uuid4().hex[:6]}@%h"
            names.append(name.replace("%h", os.uname().nodename))
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "controlplane", "worker",
                     "-P", pool, "-c", "1", "-n", name, "-l", "WARNING",
                     "--without-mingle", "--without-gossip"],
                    cwd=BASE_DIR, env=environ,
                    stdout=self.log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            replies = app.control.ping(destination=names, timeout=0.5)
            if len(replies) == count:
                return
        self.stop()
        self.log.seek(0)
        output = self.log.read().decode(errors="replace")[-3000:]
        raise RuntimeError(f"bench workers did not come up:\n{output}")

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]
