"""The OTLP/HTTP prologue `POST /v1/traces` and `POST /v1/logs` share: the
caller (`door`), the body within OTLP_INGEST_MAX_BYTES, its content type and
encoding. Each answer is OTLP/HTTP's: JSON `{"error": {"code", "message"}}`
with 401/403/413/415/429."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest, JsonResponse

from runs.otlp.door import OtlpCaller, OtlpRefused, otlp_caller
from tracing.ingest import IngestError, LimitExceeded, decode_body

__all__ = ["OtlpHttpRequest", "otlp_error", "otlp_http_request"]

_REFUSED_STATUS = {"unauthenticated": 401, "locked_out": 429, "forbidden": 403}


@dataclass
class OtlpHttpRequest:
    caller: OtlpCaller
    body: bytes  # decompressed, within OTLP_INGEST_MAX_BYTES
    content_type: str  # as sent (parse_request reads its parameters)
    json: bool  # application/json rather than application/x-protobuf


def otlp_error(status: int, code: str, message: str, **headers: str) -> JsonResponse:
    response = JsonResponse(
        {"error": {"code": code, "message": message}}, status=status
    )
    for name, value in headers.items():
        response[name] = value
    return response


def otlp_http_request(request: HttpRequest) -> OtlpHttpRequest | JsonResponse:
    """The checked caller and body of an OTLP/HTTP export, or the answer that
    refuses it (nothing is read past the size limit, nothing is stored)."""
    try:
        caller = otlp_caller(
            authorization=request.headers.get("Authorization"),
            remote_addr=request.META.get("REMOTE_ADDR"),
        )
    except OtlpRefused as refused:
        status = _REFUSED_STATUS[refused.kind]
        headers = {}
        if status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="otlp"'
        if status == 429:
            headers["Retry-After"] = str(refused.retry_after)
        code = {401: "unauthenticated", 403: "forbidden", 429: "too_many_failures"}
        return otlp_error(status, code[status], refused.message, **headers)
    limit = settings.OTLP_INGEST_MAX_BYTES
    too_large = f"the body exceeds OTLP_INGEST_MAX_BYTES={limit} bytes"
    declared = request.headers.get("Content-Length") or "0"
    if declared.isdigit() and int(declared) > limit:
        return otlp_error(413, "too_large", too_large)
    body = request.read(limit + 1)
    if len(body) > limit:
        return otlp_error(413, "too_large", too_large)
    content_type = request.headers.get("Content-Type", "")
    kind = content_type.split(";")[0].strip().lower()
    if kind not in ("application/x-protobuf", "application/json"):
        return otlp_error(
            415,
            "unsupported_media_type",
            "Content-Type must be application/x-protobuf or application/json",
        )
    try:
        data = decode_body(body, encoding=request.headers.get("Content-Encoding", ""))
    except LimitExceeded as exc:
        return otlp_error(413, "too_large", str(exc))
    except IngestError as exc:
        return otlp_error(400, "invalid", str(exc))
    return OtlpHttpRequest(
        caller=caller,
        body=data,
        content_type=content_type,
        json=kind == "application/json",
    )
