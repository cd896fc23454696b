"""Every API error is JSON that says what to fix; no stack trace ever leaks.

Three places make sure of it, whatever DEBUG says:

- `api_exception_handler`, DRF's exception handler, for everything a DRF view
  raises;
- `ApiErrorMiddleware`, for the API (`/api/`) and OTLP (`/v1/`) paths: it answers
  what a plain view raises (the OTLP endpoint is one) with JSON, and rewrites any
  other error response on those paths (Django's debug 404 and 500 pages, a CSRF
  failure, a 405 from `require_POST`) into JSON;
- `page_not_found` and `server_error`, the URLconf's handler404/handler500, which
  answer JSON on those paths when DEBUG is off.

With DEBUG on, Django's technical 500 page shows the failing frames' local
variables (the caller's bearer token among them) and the settings (the broker and
database URLs): on these paths it is never rendered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.core.exceptions import (
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from controlplane import views
from controlplane.api_input import max_body_bytes

logger = logging.getLogger(__name__)

# The paths whose every answer is JSON: the REST API and OTLP ingest.
JSON_PATH_PREFIXES = ("/api/", "/v1/")

_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
    429: "throttled",
}


def is_json_path(path: str) -> bool:
    return path.startswith(JSON_PATH_PREFIXES)


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def too_large_message() -> str:
    return (
        f"The request body is larger than {max_body_bytes()} bytes "
        "(API_MAX_BODY_BYTES); send less."
    )


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    if isinstance(exc, RequestDataTooBig):
        return Response(
            error_body("too_large", too_large_message()),
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, SuspiciousOperation):
        return Response(
            error_body("bad_request", "The request was refused as malformed."),
            status=status.HTTP_400_BAD_REQUEST,
        )
    response = exception_handler(exc, context)
    if response is None:
        logger.exception("unhandled API error", exc_info=exc)
        return Response(
            error_body("internal_error", "Internal error."),
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    if isinstance(exc, exceptions.ValidationError):
        body: dict[str, Any] = {
            "code": "invalid",
            "message": "The request is invalid; see fields.",
            "fields": exc.detail,
        }
    elif isinstance(exc, Http404):
        body = {"code": "not_found", "message": "Not found."}
    else:
        detail = (
            response.data.get("detail", "") if isinstance(response.data, dict) else ""
        )
        code = getattr(exc, "default_code", "error")
        if isinstance(exc, exceptions.APIException):
            codes = exc.get_codes()
            code = codes if isinstance(codes, str) else code
        body = {"code": code, "message": str(detail)}
        if isinstance(response.data, dict):
            body.update({k: v for k, v in response.data.items() if k != "detail"})
    response.data = {"error": body}
    return response


def _json_error(status_code: int, code: str, message: str) -> JsonResponse:
    return JsonResponse(error_body(code, message), status=status_code)


def _exception_response(request: HttpRequest, exc: Exception) -> JsonResponse:
    """The JSON answer to an exception a view on a JSON path raised."""
    if isinstance(exc, RequestDataTooBig):
        return _json_error(413, "too_large", too_large_message())
    if isinstance(exc, Http404):
        return _json_error(404, "not_found", "Not found.")
    if isinstance(exc, PermissionDenied):
        return _json_error(403, "forbidden", "You may not do this.")
    if isinstance(exc, SuspiciousOperation):
        return _json_error(400, "bad_request", "The request was refused as malformed.")
    logger.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
    return _json_error(500, "internal_error", "Internal error.")


def _is_json(response: HttpResponse) -> bool:
    return str(response.get("Content-Type", "")).startswith("application/json")


class ApiErrorMiddleware(MiddlewareMixin):
    """JSON errors on the API and OTLP paths, whatever DEBUG says.

    First in MIDDLEWARE, so it also sees the error responses that the other
    middleware and Django's own handlers make (Django's debug pages included).
    """

    def process_view(
        self,
        request: HttpRequest,
        view: Callable[..., HttpResponse],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> HttpResponse | None:
        if not is_json_path(request.path_info):
            return None
        # A NUL in a query parameter would reach a filter: SQLite matches it,
        # PostgreSQL refuses the statement (a 500). Refused for every endpoint,
        # here rather than in process_request so the answer still passes through
        # the other middleware (security headers).
        for name, values in request.GET.lists():
            if "\x00" in name or any("\x00" in value for value in values):
                shown = name.replace("\x00", "\\u0000")
                return JsonResponse(
                    error_body(
                        "invalid",
                        "The request is invalid; see fields.",
                        fields={shown: ["Null characters are not allowed."]},
                    ),
                    status=400,
                )
        return None

    def process_exception(
        self, request: HttpRequest, exception: Exception
    ) -> HttpResponse | None:
        if not is_json_path(request.path_info):
            return None
        return _exception_response(request, exception)

    def process_response(
        self, request: HttpRequest, response: HttpResponse
    ) -> HttpResponse:
        if (
            not is_json_path(request.path_info)
            or response.status_code < 400
            or response.streaming
            or _is_json(response)
        ):
            return response
        code = _CODES.get(response.status_code, "internal_error")
        message = (
            "Internal error."
            if response.status_code >= 500
            else f"{response.reason_phrase}."
        )
        replacement = _json_error(response.status_code, code, message)
        # Keep what the other middleware added (security headers, Allow, cookies).
        for header, value in response.items():
            if not header.lower().startswith("content-"):
                replacement[header] = value
        replacement.cookies = response.cookies
        return replacement


def page_not_found(
    request: HttpRequest, exception: Exception | None = None
) -> HttpResponse:
    """handler404: JSON on the API and OTLP paths, the product's page elsewhere."""
    if is_json_path(request.path_info):
        return _json_error(404, "not_found", "Not found.")
    return views.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: JSON on the API and OTLP paths, Django's page elsewhere."""
    if is_json_path(request.path_info):
        return _json_error(500, "internal_error", "Internal error.")
    return defaults.server_error(request)
