"""Who may send telemetry: the one check every OTLP transport makes.

OTLP/HTTP (`POST /v1/traces`, `POST /v1/logs`) and OTLP/gRPC (the `authorization`
metadata) hand the `Authorization` value here; it goes through the one token
authenticator (`controlplane.authentication.bearer_authenticate`) and the role
matrix (`trace.ingest`), so a token is refused or let in the same way at every
door. Each transport turns `OtlpRefused` into its own answer (an HTTP status, a
gRPC status code)."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.authentication import (
    AuthenticationRefused,
    TooManyFailures,
    bearer_authenticate,
)
from controlplane.models import ApiToken
from controlplane.permissions import Action, context_may
from controlplane.tenancy import TenantContext, tenant_context_for

__all__ = ["OtlpCaller", "OtlpRefused", "otlp_caller"]


class OtlpRefused(Exception):
    """The caller may not send telemetry. `kind`: `unauthenticated` (no, bad,
    revoked token or inactive user), `locked_out` (too many refused tokens;
    `retry_after` seconds) or `forbidden` (a role that may not write traces)."""

    def __init__(self, kind: str, message: str, *, retry_after: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after = retry_after


@dataclass(frozen=True)
class OtlpCaller:
    context: TenantContext
    token: ApiToken


def otlp_caller(*, authorization: str | None, remote_addr: str | None) -> OtlpCaller:
    """The tenant and token of an `Authorization: Bearer <token>` value that may
    ingest telemetry (`trace.ingest`); OtlpRefused otherwise."""
    try:
        token = bearer_authenticate(header=authorization, remote_addr=remote_addr)
    except TooManyFailures as exc:
        raise OtlpRefused(
            "locked_out", exc.message, retry_after=exc.retry_after
        ) from exc
    except AuthenticationRefused as exc:
        raise OtlpRefused("unauthenticated", exc.message) from exc
    if token is None:
        raise OtlpRefused(
            "unauthenticated",
            "send a tenant API token as 'Authorization: Bearer <token>'",
        )
    context = tenant_context_for(user=token.user, token=token)
    if context is None or not context_may(context, Action.TRACE_INGEST):
        raise OtlpRefused("forbidden", "the token's user may not write traces")
    return OtlpCaller(context=context, token=token)
