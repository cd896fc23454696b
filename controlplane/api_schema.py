"""The OpenAPI schema at /api/schema/ says what the API really answers.

drf-spectacular documents each view's success response; this module adds the
rest: the bearer token scheme, and the JSON error responses every operation can
give (`controlplane.api_errors`), each where it can happen. The schemathesis
test (tests/test_api_schema.py) holds the API to it against a live server.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.settings import api_settings


class ErrorDetailSerializer(serializers.Serializer[Any]):
    code = serializers.CharField(help_text="machine-readable, e.g. invalid")
    message = serializers.CharField(help_text="what went wrong and what to fix")
    fields = serializers.DictField(  # type: ignore[assignment]  # the error field
        required=False,
        child=serializers.JSONField(),
        help_text="per field or parameter: what is wrong with it (code invalid)",
    )


class ErrorSerializer(serializers.Serializer[Any]):
    """Every error answer: {"error": {"code", "message", "fields"?}}."""

    error = ErrorDetailSerializer()


_DESCRIPTIONS = {
    "400": "The request is invalid: a parameter or the body (error.fields says which).",
    "401": "No valid credentials: send 'Authorization: Bearer <token>'.",
    "403": "The caller may not do this (role, tenant, or CSRF for sessions).",
    "404": "No such object in the caller's tenant.",
    "413": "The body is larger than API_MAX_BODY_BYTES.",
    "415": "The body is not application/json.",
    "429": "Too many requests; retry after the Retry-After header's seconds.",
}


class ApiAutoSchema(AutoSchema):
    """AutoSchema plus the error responses an operation can give."""

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation: dict[str, Any] | None = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        responses = operation["responses"]
        for code in sorted(self._error_codes(operation)):
            if code not in responses:
                response = self._get_response_for_code(  # type: ignore[no-untyped-call]
                    ErrorSerializer, code
                )
                response["description"] = _DESCRIPTIONS[code]
                responses[code] = response
        return operation

    def _error_codes(self, operation: dict[str, Any]) -> set[str]:
        places = {parameter["in"] for parameter in operation.get("parameters", [])}
        codes: set[str] = set()
        if not all(isinstance(p, AllowAny) for p in self.view.get_permissions()):
            codes |= {"401", "403"}
        if "query" in places:
            codes.add("400")
        if "path" in places:
            codes.add("404")
        if "requestBody" in operation:
            codes |= {"400", "413", "415"}
        if self.view.get_throttles():
            codes.add("429")
        return codes


class ApiTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """`Authorization: Bearer <token>`: the first of REST_FRAMEWORK's authenticators
    (taken from the settings, so the schema follows it wherever it lives)."""

    target_class = api_settings.DEFAULT_AUTHENTICATION_CLASSES[0]
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, Any]:
        scheme: dict[str, Any] = build_bearer_security_scheme_object(
            header_name="AUTHORIZATION", token_prefix="Bearer"
        )
        scheme["description"] = "A tenant API token (POST /api/v1/tokens/)."
        return scheme
