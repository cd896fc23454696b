"""Browser-test fixtures: a real Daphne serving the test database (HTTP and
WebSockets), a real Celery worker, and Debian's Chromium driven by Playwright."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from controlplane.embedded_redis import free_local_port
from tests.conftest import BASE_DIR, database_url_for_subprocess, start_worker

CHROMIUM = "/usr/bin/chromium"
# Playwright's sync API keeps an event loop in this thread; the ORM calls the
# tests make between browser steps are plain sync code.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


free_port = free_local_port


class DaphneServer:
    """`daphne controlplane.asgi:application` on a port, against the test database."""

    def __init__(
        self,
        log_dir: Path,
        port: int | None = None,
        *,
        env: dict[str, str] | None = None,
    ) -> None:
        self.env = env or {}
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"daphne-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> DaphneServer:
        environ = dict(os.environ)
        environ.update(
            DATABASE_URL=database_url_for_subprocess(),
            REDIS_URL=settings.REDIS_URL,
            CELERY_QUEUE=settings.CELERY_TASK_DEFAULT_QUEUE,
            DEBUG="true",
            PYTHONUNBUFFERED="1",
        )
        environ.update(self.env)
        environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1",
                 "-p", str(self.port), "controlplane.asgi:application"],
                cwd=BASE_DIR, env=environ, stdout=sink, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"daphne exited early:\n{self.output()}")
            try:
                with urllib.request.urlopen(f"{self.url}/login/", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"daphne did not answer:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="session")
def daphne(
    django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: Any
) -> Iterator[DaphneServer]:
    server = DaphneServer(tmp_path_factory.mktemp("daphne")).start()
    yield server
    server.stop()


# Module scope: a worker left running would take the tasks of later test modules
# (they share this session's queue) without their failpoints or settings.
@pytest.fixture(scope="module")
def ui_worker(django_db_setup: Any, tmp_path_factory: Any) -> Iterator[Any]:
    worker = start_worker(tmp_path_factory.mktemp("ui-worker"))
    yield worker
    worker.stop()


# Module scope: Playwright's sync API keeps an event loop running in this thread,
# which later asyncio tests (Channels consumers) cannot share.
@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's Chromium "
            "(apt-get install -y chromium) to run the browser tests"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-background-networking", "--disable-gpu"],
        )
        yield browser
        browser.close()


# transactional_db: Daphne is another process and sees only committed rows.
@pytest.fixture
def open_page(
    chromium: Any, daphne: DaphneServer, transactional_db: Any
) -> Iterator[Any]:
    """Open a new browser context logged in as `user` (password "pw-<username>")."""
    contexts: list[Any] = []

    def login(
        user: Any, path: str = "/runs/", server: DaphneServer | None = None
    ) -> Any:
        base = (server or daphne).url
        context = chromium.new_context(
            base_url=base, viewport={"width": 1440, "height": 900}
        )
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(20_000)
        # Script errors show up in the failure report.
        page.on(
            "pageerror", lambda error: print(f"[{user.username}] page error: {error}")
        )
        page.on(
            "console",
            lambda msg: (
                print(f"[{user.username}] console {msg.type}: {msg.text}")
                if msg.type in ("error", "warning")
                else None
            ),
        )
        page.goto(f"/login/?next={path}")
        page.get_by_label("Username").fill(user.username)
        page.get_by_label("Password").fill("pw-" + user.username)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"**{path}")
        return page

    yield login
    for context in contexts:
        context.close()


# Not autouse: only a module whose worker is running can have a run moving when a
# test ends (the worker modules apply it with `usefixtures`). Elsewhere a run left
# queued never moves, and the wait cost its full 30 s per test.
@pytest.fixture
def runs_settle_before_flush(ui_worker: Any, transactional_db: Any) -> Iterator[None]:
    """Let the worker finish what a test set going (a decided run resumes) before
    the database is flushed under it."""
    yield
    from runs.models import Run

    moving = (Run.Status.QUEUED, Run.Status.RUNNING)
    deadline = time.monotonic() + 30
    while (
        time.monotonic() < deadline and Run.objects.filter(status__in=moving).exists()
    ):
        time.sleep(0.2)
    time.sleep(0.5)  # the last step's commit and its span writes
