"""The OpenAPI schema at /api/schema/ says what the API really answers.

drf-spectacular documents each view's success response; this module adds the
rest: the bearer token scheme, and the JSON error responses every operation can
give (`controlplane.api_errors`), each where it can happen. The schemathesis
test (tests/test_api_schema.py) holds the API to it against a live server.
"""

from __future__ import annotations

from typing import Any

from django.urls import NoReverseMatch, reverse
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


# -- OTLP/HTTP ----------------------------------------------------------------
# The OTLP receivers are plain Django views (OTLP's own status codes, bodies and
# protobuf answers), which drf-spectacular does not see; this hook documents each
# one that is routed, under its URL name, with the OTLP/JSON request it reads.

_ANY_VALUE: dict[str, Any] = {
    "type": "object",
    "description": "OTLP AnyValue: one of stringValue, boolValue, intValue "
    "(a string or number), doubleValue, arrayValue, kvlistValue, bytesValue",
}
_ATTRIBUTES: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["key"],
        "properties": {"key": {"type": "string"}, "value": _ANY_VALUE},
    },
}
_NANOS: dict[str, Any] = {"type": "string", "pattern": "^[0-9]{1,20}$"}
_SPAN: dict[str, Any] = {
    "type": "object",
    "required": ["traceId", "spanId", "name", "startTimeUnixNano"],
    "properties": {
        "traceId": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        "spanId": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
        "parentSpanId": {"type": "string", "pattern": "^([0-9a-f]{16})?$"},
        "name": {"type": "string"},
        "kind": {"type": "integer", "minimum": 0, "maximum": 5},
        "startTimeUnixNano": _NANOS,
        "endTimeUnixNano": _NANOS,
        "attributes": _ATTRIBUTES,
        "events": {"type": "array", "items": {"type": "object"}},
        "status": {
            "type": "object",
            "properties": {
                "code": {"type": "integer", "minimum": 0, "maximum": 2},
                "message": {"type": "string"},
            },
        },
    },
}
_LOG_RECORD: dict[str, Any] = {
    "type": "object",
    "properties": {
        "timeUnixNano": _NANOS,
        "observedTimeUnixNano": _NANOS,
        "eventName": {"type": "string"},
        "traceId": {"type": "string", "pattern": "^([0-9a-f]{32})?$"},
        "spanId": {"type": "string", "pattern": "^([0-9a-f]{16})?$"},
        "body": _ANY_VALUE,
        "attributes": _ATTRIBUTES,
    },
}


def _export_request(resources: str, scopes: str, items: str, item: Any) -> Any:
    return {
        "type": "object",
        "properties": {
            resources: {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "resource": {
                            "type": "object",
                            "properties": {"attributes": _ATTRIBUTES},
                        },
                        scopes: {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {items: {"type": "array", "items": item}},
                            },
                        },
                    },
                },
            }
        },
    }


# url name -> (path, signal, JSON request, the partial success's rejected count)
_OTLP_ROUTES = {
    "otlp-traces": (
        "/v1/traces",
        "traces",
        _export_request("resourceSpans", "scopeSpans", "spans", _SPAN),
        "rejectedSpans",
    ),
    "otlp-logs": (
        "/v1/logs",
        "logs",
        _export_request("resourceLogs", "scopeLogs", "logRecords", _LOG_RECORD),
        "rejectedLogRecords",
    ),
}
_OTLP_ERRORS = {
    "400": "Not an OTLP request, or a value the store cannot keep (the message "
    "names the span or record and the field); nothing is stored.",
    "401": _DESCRIPTIONS["401"],
    "403": "The token's role may not write telemetry (viewer).",
    "413": "The body or its span/record count is over OTLP_INGEST_MAX_BYTES / "
    "OTLP_INGEST_MAX_SPANS (the message names which).",
    "415": "Content-Type is not application/x-protobuf or application/json.",
    "429": _DESCRIPTIONS["429"],
}


def _otlp_operation(signal: str, request: Any, rejected: str) -> dict[str, Any]:
    error = {"$ref": "#/components/schemas/Error"}
    answer = {
        "type": "object",
        "description": "empty: all accepted; else a partial success",
        "properties": {
            "partialSuccess": {
                "type": "object",
                "properties": {
                    rejected: {"type": "string", "pattern": "^[0-9]+$"},
                    "errorMessage": {"type": "string"},
                },
            }
        },
    }
    return {
        "operationId": f"otlp_{signal}_export",
        "summary": f"OTLP/HTTP {signal} export",
        "description": (
            f"An OTLP/HTTP Export{signal.capitalize()}ServiceRequest, protobuf or "
            "JSON, optionally `Content-Encoding: gzip`, with a tenant API token of "
            "an admin or operator. Point an OpenTelemetry exporter's "
            "OTEL_EXPORTER_OTLP_ENDPOINT at this server (docs/tracing.md)."
        ),
        "tags": ["otlp"],
        "security": [{"bearerAuth": []}],
        "requestBody": {
            "required": True,
            "content": {
                "application/x-protobuf": {
                    "schema": {"type": "string", "format": "binary"}
                },
                "application/json": {"schema": request},
            },
        },
        "responses": {
            "200": {
                "description": "Accepted, or partly (partial_success says why).",
                "content": {
                    "application/x-protobuf": {
                        "schema": {"type": "string", "format": "binary"}
                    },
                    "application/json": {"schema": answer},
                },
            },
            **{
                code: {
                    "description": text,
                    "content": {"application/json": {"schema": error}},
                }
                for code, text in _OTLP_ERRORS.items()
            },
        },
    }


def otlp_paths(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the OTLP/HTTP receivers routed here."""
    for name, (path, signal, body, rejected) in _OTLP_ROUTES.items():
        try:
            reverse(name)
        except NoReverseMatch:
            continue  # not served by this deployment (yet)
        result.setdefault("paths", {})[path] = {
            "post": _otlp_operation(signal, body, rejected)
        }
    return result
