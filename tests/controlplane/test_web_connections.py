"""Daphne under 32 concurrent API clients: no 5xx, and on PostgreSQL it holds no
more server connections than its pool's budget (DATABASE_POOL_MAX_SIZE).

With persistent per-thread connections (CONN_MAX_AGE) every request thread of
Daphne kept its own connection, and a few clients exhausted PostgreSQL."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from controlplane.services import api_token_issue
from runs.models import Run
from tests.agents import make_agent
from tests.conftest import database_url_for_subprocess
from tests.frontend.conftest import DaphneServer

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS = 32
ROUNDS = 4
POOL_BUDGET = 4


def held_by(application_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            [application_name],
        )
        return int(cursor.fetchone()[0])


def request(
    server: DaphneServer, method: str, path: str, secret: str, body: Any = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        server.url + path,
        data=data,
        method=method,
        headers={
            "Authorization": f"Bearer {secret}",
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as reply:
            return reply.status, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:300]


def test_32_concurrent_clients_get_no_5xx_within_the_connection_budget(
    operator_user: Any, tenant: Any, tmp_path: Path
) -> None:
    make_agent(tenant, "quick", name="Quick", script=[{"text": "All done."}])
    secret = api_token_issue(tenant=tenant, user=operator_user).secret
    application_name = f"cp-test-web-{uuid.uuid4().hex[:8]}"
    database_url = database_url_for_subprocess()
    if connection.vendor == "postgresql":
        database_url += f"?application_name={application_name}"
    server = DaphneServer(
        tmp_path,
        env={
            "DATABASE_URL": database_url,
            "DATABASE_POOL_MAX_SIZE": str(POOL_BUDGET),
        },
    )
    server.start()
    statuses: list[int] = []
    failures: list[str] = []
    held: list[int] = []
    lock = threading.Lock()
    done = threading.Event()

    def client(number: int) -> None:
        for round_ in range(ROUNDS):
            try:
                code, body = request(
                    server, "POST", "/api/v1/runs/", secret,
                    {"agent": "quick", "input": f"client {number} round {round_}"},
                )  # fmt: skip
                answers = [code]
                if code == 201:
                    answers.append(
                        request(server, "GET", f"/api/v1/runs/{body['id']}/", secret)[0]
                    )
                answers.append(request(server, "GET", "/api/v1/runs/", secret)[0])
            except OSError as exc:  # a refused or dropped connection is a failure
                with lock:
                    failures.append(f"client {number}: {exc!r}")
                return
            with lock:
                statuses.extend(answers)
                if code != 201:
                    failures.append(f"client {number}: POST answered {code}: {body}")

    def sample() -> None:
        try:
            while not done.is_set():
                held.append(held_by(application_name))
                time.sleep(0.05)
        finally:
            connection.close()

    sampler = threading.Thread(target=sample, daemon=True)
    if connection.vendor == "postgresql":
        sampler.start()
    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        if connection.vendor == "postgresql":
            held.append(held_by(application_name))
    finally:
        done.set()
        server.stop()
    assert not any(t.is_alive() for t in threads), "a client never finished"
    assert not failures, failures[:5]
    assert len(statuses) == CLIENTS * ROUNDS * 3
    assert not [s for s in statuses if s >= 500]
    assert set(statuses) == {200, 201}
    assert Run.objects.filter(tenant=tenant).count() == CLIENTS * ROUNDS
    if connection.vendor == "postgresql":
        sampler.join(5)
        assert max(held) >= 1, "the sampler never saw Daphne's connections"
        assert max(held) <= POOL_BUDGET, held
