"""`Idempotency-Key` on API writes: the same key and body get the same answer.

A client that lost an answer (a timeout, a 5xx, a dropped connection) retries
with the key it sent; the write is not done again, the stored answer is sent
back. The key row is written in the transaction of the write itself, so a key
exists exactly when its work was committed: a request that failed left no key,
and its retry does the work. Keys are per tenant and expire after
`IDEMPOTENCY_KEY_TTL_SECONDS`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.models import IdempotencyKey, Tenant

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255

IDEMPOTENCY_KEY_PARAMETER = OpenApiParameter(
    HEADER,
    str,
    location=OpenApiParameter.HEADER,
    required=False,
    description=(
        "A unique value per intended write (a UUID), at most 255 visible ASCII "
        "characters. A retry with the same key and body gets the first answer "
        f"again (header `{REPLAYED_HEADER}: true`) and never repeats the write; "
        "the same key with another body is refused with 422 "
        "`idempotency_key_reused`. Keys are per tenant and kept "
        "IDEMPOTENCY_KEY_TTL_SECONDS (24 h by default)."
    ),
)

IDEMPOTENCY_KEY_REUSED = OpenApiResponse(
    description="`idempotency_key_reused`: the Idempotency-Key was already used "
    "for another request (another body, or another operation) in this tenant; "
    "nothing was done."
)


class IdempotencyKeyReused(APIException):
    """The key was already used for a different request in this tenant."""

    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_code = "idempotency_key_reused"
    default_detail = "The Idempotency-Key was used for a different request."


def idempotency_key_of(request: Request) -> str | None:
    """The request's key, None without one; a malformed key is a 400."""
    raw = request.headers.get(HEADER)
    if raw is None:
        return None
    if not raw or len(raw) > MAX_KEY_LENGTH or not all(33 <= ord(c) < 127 for c in raw):
        raise ValidationError(
            {
                HEADER: [
                    f"1 to {MAX_KEY_LENGTH} visible ASCII characters without "
                    "spaces (a UUID is a good key)"
                ]
            }
        )
    return raw


def request_fingerprint(*, operation: str, body: Any) -> str:
    """sha256 of the operation and the body, independent of key order."""
    canonical = json.dumps(
        {"operation": operation, "body": body},
        sort_keys=True,
        separators=(",", ":"),
        cls=DjangoJSONEncoder,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def idempotency_key_claim(
    *, tenant: Tenant, key: str, operation: str, request_sha256: str
) -> tuple[IdempotencyKey, bool]:
    """Inside the caller's transaction: the key's row, and whether it is new.

    On PostgreSQL a concurrent request with the same key waits on the unique
    index until this transaction ends, then finds the stored answer (or, when
    this one rolled back, claims the key itself); SQLite runs one writer at a
    time. An expired key is reclaimed. A key of another request raises
    IdempotencyKeyReused.
    """
    now = timezone.now()
    IdempotencyKey.objects.filter(tenant=tenant, key=key, expires_at__lte=now).delete()
    row, created = IdempotencyKey.objects.get_or_create(
        tenant=tenant,
        key=key,
        defaults={
            "operation": operation,
            "request_sha256": request_sha256,
            "expires_at": now
            + dt.timedelta(seconds=settings.IDEMPOTENCY_KEY_TTL_SECONDS),
        },
    )
    if not created and (
        row.operation != operation or row.request_sha256 != request_sha256
    ):
        what = (
            "with another body"
            if row.operation == operation
            else f"for {row.operation}"
        )
        raise IdempotencyKeyReused(
            f"{HEADER} {key!r} was already used {what} at "
            f"{row.created_at.isoformat()}; send a new key for a new request "
            "(a retry must repeat the first request's body exactly)."
        )
    return row, created


def idempotency_key_record(*, claim: IdempotencyKey, response: Response) -> None:
    """Store the answer with the key, in the transaction of the write."""
    IdempotencyKey.objects.filter(pk=claim.pk).update(
        response_status=response.status_code, response_body=response.data
    )


def idempotency_keys_purge() -> int:
    """Delete expired keys; the number deleted."""
    deleted, _ = IdempotencyKey.objects.filter(expires_at__lte=timezone.now()).delete()
    return deleted


def idempotent(
    request: Request,
    *,
    tenant: Tenant,
    operation: str,
    respond: Callable[[], Response],
) -> Response:
    """Answer `respond()` once per key: a retry with the key gets the stored answer.

    Without a key it is `respond()`. With one, the claim, the write inside
    `respond()` and the stored answer commit together; an exception (a 4xx the
    view raises, a database error) rolls all of it back, so the key stays free
    for the retry. Work enqueued on commit runs when this transaction commits.
    """
    key = idempotency_key_of(request)
    if key is None:
        return respond()
    fingerprint = request_fingerprint(operation=operation, body=request.data)
    with transaction.atomic():
        claim, created = idempotency_key_claim(
            tenant=tenant, key=key, operation=operation, request_sha256=fingerprint
        )
        if not created:
            return Response(
                claim.response_body,
                status=claim.response_status,
                headers={REPLAYED_HEADER: "true"},
            )
        response = respond()
        idempotency_key_record(claim=claim, response=response)
    return response
