"""Deliver a final gate to its webhook, signed, with retries that wait in the
database, never in a worker (DESIGN.md §7: nothing waits inside Celery).

A delivery is one POST of the gate JSON (`gate_view`) with the header
`X-ControlPlane-Signature: t=<unix>,v1=<hex hmac_sha256(key, "<t>.<body>")>`,
key = the tenant secret `gate_webhook`. A 2xx answer delivers it; anything else
is retried after 5 s, 10 s, 20 s ... (GATE_WEBHOOK_BACKOFF_SECONDS, doubled, at
most an hour) until GATE_WEBHOOK_MAX_ATTEMPTS, then given up (audited). Each
attempt claims the row (compare-and-set on `webhook_next_at`), so a duplicate
task or a sweep racing the first enqueue delivers once; a worker that dies
mid-attempt leaves the claim to lapse and the sweep tries again.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.client
import json
import random
import socket
import ssl
import time
from urllib.parse import urlsplit

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from controlplane.redaction import scrub_known_secrets
from controlplane.secrets import SecretMissing, SecretUnreadable, secret_value
from controlplane.services import audit_record
from runs.models import ExternalGate
from runs.services.gates import (
    GATE_WEBHOOK_SECRET,
    GateInputError,
    gate_view,
    webhook_target,
)

SIGNATURE_HEADER = "X-ControlPlane-Signature"
MAX_BACKOFF_SECONDS = 3600.0
_ANSWER_BYTES = 4096  # of a receiver's answer, read (and dropped)


def webhook_signature(*, key: str, body: bytes, timestamp: int) -> str:
    """The signature header's value for `body` sent at `timestamp`."""
    mac = hmac.new(key.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def webhook_backoff(attempts: int) -> float:
    """Seconds before the next try after `attempts` failed ones (with jitter, so
    receivers that come back are not hit by every retry at once)."""
    first: float = settings.GATE_WEBHOOK_BACKOFF_SECONDS
    base = first * 2.0 ** max(0, attempts - 1)
    return min(MAX_BACKOFF_SECONDS, base) * random.uniform(0.9, 1.1)


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to an address checked just before (no DNS rebinding between the
    check and the connection); the Host header keeps the URL's name."""

    def __init__(self, host: str, port: int, *, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, *, address: str, timeout: float):
        super().__init__(
            host, port, timeout=timeout, context=ssl.create_default_context()
        )
        self._address = address

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        # The certificate is checked against the URL's host name.
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)  # type: ignore[attr-defined]


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST to the checked address of `url`; the answer's status."""
    host, port, addresses = webhook_target(url)
    parts = urlsplit(url)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    kind = _PinnedHTTPSConnection if parts.scheme == "https" else _PinnedHTTPConnection
    connection = kind(
        host,
        port,
        address=addresses[0],
        timeout=settings.GATE_WEBHOOK_TIMEOUT_SECONDS,
    )
    try:
        connection.request("POST", path, body=body, headers=headers)
        answer = connection.getresponse()
        answer.read(_ANSWER_BYTES)
        return answer.status
    finally:
        connection.close()


def gate_webhook_deliver(*, gate_id: str) -> str:
    """One attempt to deliver the gate's webhook, if it is due; what happened:
    `delivered`, `retry`, `failed`, or `not_due` (delivered, or claimed)."""
    now = timezone.now()
    lease = dt.timedelta(seconds=settings.GATE_WEBHOOK_TIMEOUT_SECONDS * 3 + 5)
    claimed = ExternalGate.objects.filter(
        id=gate_id,
        webhook_state=ExternalGate.Webhook.DUE,
        webhook_next_at__lte=now,
    ).update(webhook_next_at=now + lease, webhook_attempts=F("webhook_attempts") + 1)
    if not claimed:
        return "not_due"
    gate = ExternalGate.objects.select_related(
        "run", "tenant", "approval__decided_by"
    ).get(id=gate_id)
    try:
        key = secret_value(tenant_id=gate.tenant_id, name=GATE_WEBHOOK_SECRET)
    except (SecretMissing, SecretUnreadable) as missing:
        return _give_up(gate, f"the signing secret is unavailable: {missing}")
    body = json.dumps(gate_view(gate), separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "controlplane-gate-webhook/1",
        SIGNATURE_HEADER: webhook_signature(
            key=key, body=body, timestamp=int(time.time())
        ),
        "X-ControlPlane-Gate": str(gate.id),
        "X-ControlPlane-Delivery": str(gate.webhook_attempts),
    }
    try:
        status = _post(gate.webhook_url, body, headers)
        problem = "" if 200 <= status < 300 else f"the receiver answered {status}"
    except GateInputError as refused:
        problem = str(refused)
    except (OSError, http.client.HTTPException) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    if not problem:
        ExternalGate.objects.filter(id=gate.id).update(
            webhook_state=ExternalGate.Webhook.DELIVERED,
            webhook_next_at=None,
            webhook_last_error="",
        )
        return "delivered"
    if gate.webhook_attempts >= settings.GATE_WEBHOOK_MAX_ATTEMPTS:
        return _give_up(gate, problem)
    ExternalGate.objects.filter(id=gate.id).update(
        webhook_next_at=timezone.now()
        + dt.timedelta(seconds=webhook_backoff(gate.webhook_attempts)),
        webhook_last_error=_short(problem),
    )
    return "retry"


def _short(problem: str) -> str:
    return scrub_known_secrets(problem)[:500]


def _give_up(gate: ExternalGate, problem: str) -> str:
    ExternalGate.objects.filter(id=gate.id).update(
        webhook_state=ExternalGate.Webhook.FAILED,
        webhook_next_at=None,
        webhook_last_error=_short(problem),
    )
    audit_record(
        tenant=gate.tenant,
        actor=None,
        action="gate.webhook_failed",
        object_type="gate",
        object_id=str(gate.id),
        after={"attempts": gate.webhook_attempts, "error": _short(problem)},
    )
    return "failed"


def gate_webhooks_due(*, now: dt.datetime | None = None, limit: int = 500) -> list[str]:
    """Gates whose webhook is due (a retry's time came, or an enqueue was lost)."""
    return [
        str(gate_id)
        for gate_id in ExternalGate.objects.filter(
            webhook_state=ExternalGate.Webhook.DUE,
            webhook_next_at__lte=now or timezone.now(),
        )
        .order_by("webhook_next_at")
        .values_list("id", flat=True)[:limit]
    ]
