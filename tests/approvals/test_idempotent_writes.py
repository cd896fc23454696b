"""Writes committed while the broker is unreachable are answered with what was
committed (the enqueue is recovery's job), and an `Idempotency-Key` makes a
client's retry return the first answer instead of doing the work again."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from django.conf import settings
from django.utils import timezone

from approvals.models import ApprovalDecision
from controlplane.celery import app as celery_app
from controlplane.models import IdempotencyKey
from controlplane.services import api_token_issue
from controlplane.tasks import idempotency_keys_purge_task
from runs.models import Run
from runs.services import recover_stalled_runs
from shop.models import Refund
from tests.agents import make_agent
from tests.approvals.conftest import REFUND_ARGS, call, script_of
from tests.conftest import start_worker, wait_for
from tests.frontend.conftest import DaphneServer

pytestmark = pytest.mark.django_db(transaction=True)


def _broker_at(url: str) -> None:
    # The producer pools are built from the URL on first use: drop them so the
    # next enqueue connects to `url`.
    celery_app.conf.broker_url = url
    celery_app._pool = None
    celery_app.amqp._producer_pool = None


@contextlib.contextmanager
def broker_unreachable() -> Iterator[None]:
    """Enqueues go to a real Redis address where nothing listens (refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free, and closed once the block ends
    working = celery_app.conf.broker_url
    _broker_at(f"redis://127.0.0.1:{port}/0")
    try:
        yield
    finally:
        _broker_at(working)


def recover_now() -> int:
    """One pass of the beat's recovery, treating any queued run as stale."""
    saved = settings.RUN_LEASE_SECONDS, settings.RUN_ENQUEUE_GRACE_SECONDS
    settings.RUN_LEASE_SECONDS = settings.RUN_ENQUEUE_GRACE_SECONDS = 0.5
    try:
        time.sleep(0.6)
        return recover_stalled_runs()
    finally:
        settings.RUN_LEASE_SECONDS, settings.RUN_ENQUEUE_GRACE_SECONDS = saved


def test_a_run_started_while_the_broker_is_down_is_201_and_recovery_runs_it(
    scripted_agent: Any, operator_user: Any, tenant: Any, api_client_for: Any,
    tmp_path: Any,
) -> None:  # fmt: skip
    scripted_agent([{"text": "All done."}], [], slug="quick")
    client = api_client_for(operator_user, tenant)
    key = str(uuid.uuid4())
    body = {"agent": "quick", "input": "say done"}
    with broker_unreachable():
        first = client.post(
            "/api/v1/runs/", body, format="json", HTTP_IDEMPOTENCY_KEY=key
        )
        assert first.status_code == 201, first.content
        retry = client.post(
            "/api/v1/runs/", body, format="json", HTTP_IDEMPOTENCY_KEY=key
        )
    assert retry.status_code == 201
    assert retry.json() == first.json()
    assert retry["Idempotent-Replayed"] == "true"
    run = Run.objects.get()
    assert str(run.id) == first.json()["id"]
    assert run.status == Run.Status.QUEUED and run.step_token is not None

    worker = start_worker(tmp_path)
    try:
        assert recover_now() == 1
        done = wait_for(
            lambda: Run.objects.filter(id=run.id, status=Run.Status.UNVERIFIED).first(),
            timeout=60,
            what="the recovered run to finish",
        )
    finally:
        worker.stop()
    assert done.final_answer == "All done."
    # Later retries still get the first answer; there is one run, ever.
    late = client.post("/api/v1/runs/", body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert late.status_code == 201
    assert late.json() == first.json()
    assert Run.objects.count() == 1


def test_the_same_key_with_another_body_is_422_and_starts_nothing(
    scripted_agent: Any, operator_user: Any, tenant: Any, api_client_for: Any
) -> None:
    scripted_agent([{"text": "All done."}], [], slug="quick")
    client = api_client_for(operator_user, tenant)
    key = "order-4821-retry-1"
    first = client.post(
        "/api/v1/runs/", {"agent": "quick", "input": "one"}, format="json",
        HTTP_IDEMPOTENCY_KEY=key,
    )  # fmt: skip
    assert first.status_code == 201
    other = client.post(
        "/api/v1/runs/", {"agent": "quick", "input": "two"}, format="json",
        HTTP_IDEMPOTENCY_KEY=key,
    )  # fmt: skip
    assert other.status_code == 422
    error = other.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert key in error["message"] and "another body" in error["message"]
    assert list(Run.objects.values_list("input", flat=True)) == ["one"]
    bad = client.post(
        "/api/v1/runs/", {"agent": "quick", "input": "three"}, format="json",
        HTTP_IDEMPOTENCY_KEY="has spaces",
    )  # fmt: skip
    assert bad.status_code == 400
    assert "Idempotency-Key" in bad.json()["error"]["fields"]
    assert Run.objects.count() == 1


def test_keys_are_per_tenant(
    scripted_agent: Any, operator_user: Any, tenant: Any, other_tenant: Any,
    make_member: Any, api_client_for: Any,
) -> None:  # fmt: skip
    scripted_agent([{"text": "All done."}], [], slug="quick")
    make_agent(other_tenant, "quick", name="Quick", script=[{"text": "Other."}])
    other_user = make_member(other_tenant, "otto-other", "operator")
    body = {"agent": "quick", "input": "same"}
    ours = api_client_for(operator_user, tenant).post(
        "/api/v1/runs/", body, format="json", HTTP_IDEMPOTENCY_KEY="k1"
    )
    theirs = api_client_for(other_user, other_tenant).post(
        "/api/v1/runs/", body, format="json", HTTP_IDEMPOTENCY_KEY="k1"
    )
    assert ours.status_code == theirs.status_code == 201
    assert ours.json()["id"] != theirs.json()["id"]
    assert "Idempotent-Replayed" not in theirs
    assert Run.objects.filter(tenant=tenant).count() == 1
    assert Run.objects.filter(tenant=other_tenant).count() == 1


def test_a_decision_while_the_broker_is_down_is_200_and_its_retry_is_the_same(
    waiting_run: Any, operator_user: Any, tenant: Any, api_client_for: Any,
    tmp_path: Any,
) -> None:  # fmt: skip
    run, approval = waiting_run(script_of(call("refund", REFUND_ARGS)))
    client = api_client_for(operator_user, tenant)
    url = f"/api/v1/approvals/{approval.id}/decide/"
    body = {"decision": "approve", "reason": "dented spout"}
    key = str(uuid.uuid4())
    with broker_unreachable():
        first = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY=key)
        assert first.status_code == 200, first.content
        retry = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert first.json()["status"] == "approved"
    assert retry.status_code == 200
    assert retry.json() == first.json()
    assert ApprovalDecision.objects.count() == 1
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED  # resumed, its step waits for recovery
    conflicting = client.post(
        url, {"decision": "deny", "reason": "no"}, format="json",
        HTTP_IDEMPOTENCY_KEY=key,
    )  # fmt: skip
    assert conflicting.status_code == 422
    assert conflicting.json()["error"]["code"] == "idempotency_key_reused"

    worker = start_worker(tmp_path)
    try:
        assert recover_now() == 1
        wait_for(
            lambda: Run.objects.filter(
                id=run.id, status=Run.Status.UNVERIFIED
            ).exists(),
            timeout=60,
            what="the resumed run to finish",
        )
    finally:
        worker.stop()
    assert Refund.objects.count() == 1
    assert ApprovalDecision.objects.count() == 1
    assert IdempotencyKey.objects.filter(tenant=tenant, key=key).count() == 1


def test_the_schema_documents_the_idempotency_key_on_both_writes(
    operator_user: Any, tenant: Any, api_client_for: Any
) -> None:
    response = api_client_for(operator_user, tenant).get("/api/schema/")
    assert response.status_code == 200
    paths = yaml.safe_load(response.content)["paths"]
    for path in ("/api/v1/runs/", "/api/v1/approvals/{approval_id}/decide/"):
        operation = paths[path]["post"]
        headers = [p for p in operation["parameters"] if p["in"] == "header"]
        assert [h["name"] for h in headers] == ["Idempotency-Key"], path
        assert headers[0].get("required", False) is False
        assert "422" in operation["responses"], path


def test_concurrent_retries_with_one_key_start_one_run(
    scripted_agent: Any, operator_user: Any, tenant: Any, tmp_path: Any
) -> None:
    """Eight copies of one request at once, through a real Daphne (a thread
    each): one run, and every answer is its answer."""
    scripted_agent([{"text": "All done."}], [], slug="quick")
    secret = api_token_issue(tenant=tenant, user=operator_user).secret
    server = DaphneServer(tmp_path).start()
    answers: list[tuple[int, Any]] = []
    barrier = threading.Barrier(8)

    def post() -> None:
        request = urllib.request.Request(
            f"{server.url}/api/v1/runs/",
            data=json.dumps({"agent": "quick", "input": "once"}).encode(),
            method="POST",
            headers={
                "Authorization": f"Bearer {secret}",
                "Content-Type": "application/json",
                "Idempotency-Key": "one-key",
            },
        )
        barrier.wait()
        with urllib.request.urlopen(request, timeout=60) as reply:
            answers.append((reply.status, json.loads(reply.read())))

    threads = [threading.Thread(target=post) for _ in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        server.stop()
    assert len(answers) == 8, server.output()
    assert {status for status, _ in answers} == {201}
    assert len({json.dumps(body, sort_keys=True) for _, body in answers}) == 1
    assert Run.objects.count() == 1
    assert str(Run.objects.get().id) == answers[0][1]["id"]


def test_an_expired_key_is_free_again_and_beat_purges_expired_keys(
    scripted_agent: Any, operator_user: Any, tenant: Any, api_client_for: Any
) -> None:
    scripted_agent([{"text": "All done."}], [], slug="quick")
    client = api_client_for(operator_user, tenant)
    for key in ("old-key", "kept-key"):
        response = client.post(
            "/api/v1/runs/", {"agent": "quick", "input": key}, format="json",
            HTTP_IDEMPOTENCY_KEY=key,
        )  # fmt: skip
        assert response.status_code == 201
    # Past its time-to-live (as if IDEMPOTENCY_KEY_TTL_SECONDS had passed).
    IdempotencyKey.objects.filter(key="old-key").update(expires_at=timezone.now())
    again = client.post(
        "/api/v1/runs/", {"agent": "quick", "input": "new work"}, format="json",
        HTTP_IDEMPOTENCY_KEY="old-key",
    )  # fmt: skip
    assert again.status_code == 201
    assert "Idempotent-Replayed" not in again
    assert Run.objects.count() == 3
    IdempotencyKey.objects.filter(key="old-key").update(expires_at=timezone.now())
    assert idempotency_keys_purge_task.apply().get() == 1
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["kept-key"]
