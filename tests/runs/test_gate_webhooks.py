"""Gate webhooks: a real local HTTP server receives the final gate from a real
Celery worker and checks its signature with the tenant secret; failed
deliveries are retried from the database, then given up."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from controlplane.models import AuditEvent
from controlplane.secrets import secret_set
from runs.models import ExternalGate
from runs.services.gate_webhooks import gate_webhook_deliver, webhook_backoff
from runs.tasks import gate_webhooks_due_task
from tests.conftest import start_worker, wait_for

KEY = "whsec-5f1c0e9a7b"
TRACE = "5b8efff798038103d269b633813fc60c"
ASK: dict[str, Any] = {
    "tool": "wire_transfer",
    "arguments": {"account": "DE89 3704", "amount": 120},
    "trace_id": TRACE,
}


class Receiver:
    """An HTTP server that records each POST and answers `statuses` in turn
    (then 204)."""

    def __init__(self) -> None:
        self.deliveries: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.deliveries.append(
                    {"path": self.path, "headers": dict(self.headers), "raw": raw}
                )
                status = receiver.statuses.pop(0) if receiver.statuses else 204
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/gate?src=cp"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def verified(delivery: dict[str, Any], key: str = KEY) -> dict[str, Any]:
    """The delivery's body, after checking its signature as a receiver would."""
    header = delivery["headers"]["X-ControlPlane-Signature"]
    parts = dict(item.split("=", 1) for item in header.split(","))
    expected = hmac.new(
        key.encode(), parts["t"].encode() + b"." + delivery["raw"], hashlib.sha256
    ).hexdigest()
    assert hmac.compare_digest(parts["v1"], expected), "bad signature"
    body: dict[str, Any] = json.loads(delivery["raw"])
    return body


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def webhook_worker(tmp_path: Any, transactional_db: Any) -> Iterator[Any]:
    worker = start_worker(
        tmp_path,
        extra_env={
            "GATE_WEBHOOK_ALLOW_PRIVATE": "true",
            "GATE_WEBHOOK_BACKOFF_SECONDS": "0",
        },
    )
    yield worker
    worker.stop()


@pytest.fixture
def ready(settings: Any, tenant: Any) -> None:
    settings.GATE_WEBHOOK_ALLOW_PRIVATE = True
    settings.GATE_WEBHOOK_BACKOFF_SECONDS = 0
    secret_set(tenant=tenant, name="gate_webhook", value=KEY, actor=None)


def test_a_decided_gate_is_posted_signed_to_its_webhook(
    webhook_worker, receiver, ready, tenant, operator_user, admin_user, api_client_for
):
    agent = api_client_for(operator_user, tenant)
    gate = agent.post(
        "/api/v1/gates/", {**ASK, "webhook_url": receiver.url}, format="json"
    ).json()
    assert gate["status"] == "pending"
    assert receiver.deliveries == []  # nothing to tell yet
    api_client_for(admin_user, tenant).post(
        f"/api/v1/approvals/{gate['approval_id']}/decide/",
        {"decision": "approve", "reason": "checked the IBAN"},
        format="json",
    )
    wait_for(lambda: receiver.deliveries, what="the webhook")
    delivery = receiver.deliveries[0]
    assert delivery["path"] == "/hooks/gate?src=cp"
    assert delivery["headers"]["Content-Type"] == "application/json"
    body = verified(delivery)
    assert body["id"] == gate["id"] and body["status"] == "approved"
    assert body["final"] is True and body["decided_by"] == "alice-admin"
    assert body["reason"] == "checked the IBAN"
    assert body == agent.get(f"/api/v1/gates/{gate['id']}/").json()
    with pytest.raises(AssertionError, match="bad signature"):
        verified(delivery, key="another key")
    wait_for(
        lambda: ExternalGate.objects.get(id=gate["id"]).webhook_state == "delivered",
        what="delivered",
    )
    assert KEY not in delivery["raw"].decode()


def test_failed_deliveries_are_retried_from_the_database(
    webhook_worker, receiver, ready, tenant, operator_user, api_client_for
):
    receiver.statuses = [500, 503]
    gate = (
        api_client_for(operator_user, tenant)
        .post(
            "/api/v1/gates/",
            {**ASK, "effect": "read_only", "webhook_url": receiver.url},
            format="json",
        )
        .json()
    )
    assert gate["status"] == "allowed"  # final at once: delivered at once
    wait_for(lambda: len(receiver.deliveries) == 1, what="the first attempt")
    row = wait_for(
        lambda: ExternalGate.objects.filter(
            id=gate["id"], webhook_last_error__contains="500"
        ).first(),
        what="the failure recorded",
    )
    assert row.webhook_state == "due" and row.webhook_attempts == 1
    # Beat's sweep finds what is due; the worker tries again (503, then 204).
    for attempts in (2, 3):
        wait_for(
            lambda n=attempts: (
                gate_webhooks_due_task() >= 0 and len(receiver.deliveries) >= n
            ),
            what=f"attempt {attempts}",
        )
    wait_for(
        lambda: ExternalGate.objects.get(id=gate["id"]).webhook_state == "delivered",
        what="delivered",
    )
    assert [d["headers"]["X-ControlPlane-Delivery"] for d in receiver.deliveries] == [
        "1",
        "2",
        "3",
    ]
    bodies = [verified(d) for d in receiver.deliveries]
    assert all(b == bodies[0] for b in bodies) and bodies[0]["status"] == "allowed"


def test_a_webhook_that_keeps_failing_is_given_up_and_audited(
    receiver, ready, settings, tenant, operator_user, api_client_for, db
):
    settings.GATE_WEBHOOK_MAX_ATTEMPTS = 2
    receiver.statuses = [500, 500, 500]
    gate = (
        api_client_for(operator_user, tenant)
        .post(
            "/api/v1/gates/",
            {**ASK, "effect": "read_only", "webhook_url": receiver.url},
            format="json",
        )
        .json()
    )
    # In this process (the test's transaction never commits, so no task runs).
    assert gate_webhook_deliver(gate_id=gate["id"]) == "retry"
    assert gate_webhook_deliver(gate_id=gate["id"]) == "failed"
    assert gate_webhook_deliver(gate_id=gate["id"]) == "not_due"
    assert len(receiver.deliveries) == 2
    row = ExternalGate.objects.get(id=gate["id"])
    assert row.webhook_state == "failed" and "500" in row.webhook_last_error
    audit = AuditEvent.objects.get(action="gate.webhook_failed")
    assert audit.after["attempts"] == 2


def test_a_delivery_refuses_an_address_that_became_private(
    receiver, ready, settings, tenant, operator_user, api_client_for, db
):
    gate = (
        api_client_for(operator_user, tenant)
        .post(
            "/api/v1/gates/",
            {**ASK, "effect": "read_only", "webhook_url": receiver.url},
            format="json",
        )
        .json()
    )
    settings.GATE_WEBHOOK_ALLOW_PRIVATE = False
    settings.GATE_WEBHOOK_MAX_ATTEMPTS = 1
    assert gate_webhook_deliver(gate_id=gate["id"]) == "failed"
    assert receiver.deliveries == []
    row = ExternalGate.objects.get(id=gate["id"])
    assert "public address" in row.webhook_last_error


def test_the_backoff_doubles_up_to_an_hour(settings):
    settings.GATE_WEBHOOK_BACKOFF_SECONDS = 5
    assert 4.5 <= webhook_backoff(1) <= 5.5
    assert 9 <= webhook_backoff(2) <= 11
    assert 36 <= webhook_backoff(4) <= 44
    assert 3240 <= webhook_backoff(20) <= 3960
