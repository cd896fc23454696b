"""Checking the signature of a gate's webhook (`X-ControlPlane-Signature`)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

SIGNATURE_HEADER = "X-ControlPlane-Signature"


class WebhookSignatureError(ValueError):
    """The body was not signed by the tenant's `gate-webhook` secret, or too long
    ago (a replay); the webhook must not be acted on."""


def verify_webhook(
    *,
    body: bytes,
    signature: str,
    secret: str | bytes,
    tolerance_seconds: float = 300.0,
    now: float | None = None,
) -> dict[str, Any]:
    """The gate JSON of a webhook whose `X-ControlPlane-Signature`
    (`t=<unix>,v1=<hex>`, v1 = HMAC-SHA256 of `f"{t}.{body}"` under the secret)
    matches, and whose `t` is within `tolerance_seconds` of now; else
    WebhookSignatureError. `body` is the raw request body, before any parsing."""
    key = secret.encode() if isinstance(secret, str) else secret
    parts: dict[str, list[str]] = {}
    for item in signature.split(","):
        name, _, value = item.strip().partition("=")
        parts.setdefault(name, []).append(value)
    stamps = parts.get("t") or []
    if len(stamps) != 1 or not stamps[0].isdigit():
        raise WebhookSignatureError("the signature has no timestamp")
    stamp = int(stamps[0])
    current = time.time() if now is None else now
    if abs(current - stamp) > tolerance_seconds:
        raise WebhookSignatureError("the signature's timestamp is too old")
    expected = hmac.new(key, f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    # Any v1 may match (the sender lists one per key while a secret rotates).
    if not any(hmac.compare_digest(expected, given) for given in parts.get("v1", [])):
        raise WebhookSignatureError("the signature does not match")
    parsed = json.loads(body)
    if not isinstance(parsed, dict):
        raise WebhookSignatureError("the body is not a gate")
    return parsed


def sign_webhook(
    *, body: bytes, secret: str | bytes, timestamp: int | None = None
) -> str:
    """The header value the control plane sends for `body` (for tests of a
    receiver)."""
    key = secret.encode() if isinstance(secret, str) else secret
    stamp = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(key, f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={stamp},v1={digest}"
