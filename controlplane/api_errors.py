"""Every API error is JSON that says what to fix; no stack trace ever leaks."""

from __future__ import annotations

import logging
from typing import Any

from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

logger = logging.getLogger(__name__)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    response = exception_handler(exc, context)
    if response is None:
        logger.exception("unhandled API error", exc_info=exc)
        return Response(
            {"error": {"code": "internal_error", "message": "Internal error."}},
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
