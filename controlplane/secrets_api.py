"""/api/v1/secrets/: the tenant's secret store over the API.

Write-only: a value goes in with PUT (or POST) and never comes back out; what is
listed is each secret's name, who set it and when. Every member may read the
names (an agent's or an MCP server's settings refer to them); admins set and
delete. The values never appear in a response, an error or the audit log.
"""

from __future__ import annotations

from typing import Any

from django.views.decorators.debug import sensitive_variables
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane import selectors
from controlplane.api_input import reject_unknown_fields, remote_addr
from controlplane.models import Secret
from controlplane.permissions import Action, Gate
from controlplane.secrets import (
    MAX_VALUE_CHARS,
    NAME_PATTERN,
    SecretInputError,
    SecretKeysUnavailable,
    secret_delete,
    secret_name_problem,
    secret_set,
)
from controlplane.tenancy import tenant_of

NAME_PARAMETER = OpenApiParameter(
    "name",
    str,
    OpenApiParameter.PATH,
    pattern=NAME_PATTERN.pattern.removesuffix("\\Z").join("^$"),
    description="The secret's name (letters, digits, underscores).",
)


class SecretStoreUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "secret_store_unavailable"
    default_detail = "The secret store has no usable key."


class SecretOutputSerializer(serializers.Serializer[Any]):
    """What anyone may know about a secret: never its value."""

    name = serializers.CharField()
    created_by = serializers.CharField(
        source="created_by.username", allow_null=True, default=None
    )
    created_at = serializers.DateTimeField()
    updated_by = serializers.CharField(
        source="updated_by.username", allow_null=True, default=None
    )
    updated_at = serializers.DateTimeField()


class _ValueInput(serializers.Serializer[Any]):
    value = serializers.CharField(
        max_length=MAX_VALUE_CHARS,
        trim_whitespace=False,
        write_only=True,
        help_text="The secret's value; stored encrypted, never returned.",
    )


class SecretCreateInputSerializer(_ValueInput):
    name = serializers.CharField(max_length=64)


def _secret_of(request: Request, name: str) -> Secret:
    context = tenant_of(request)
    secret = (
        None
        if secret_name_problem(name)  # names no secret (and may hold a NUL)
        else selectors.secret_list_for(tenant=context.tenant).filter(name=name).first()
    )
    if secret is None:
        raise NotFound("No secret of this name in this tenant.")
    return secret


@sensitive_variables("value")
def _set(request: Request, name: str, value: str) -> Response:
    context = tenant_of(request)
    if problem := secret_name_problem(name):
        raise ValidationError({"name": [problem]})
    existed = selectors.secret_list_for(tenant=context.tenant).filter(name=name)
    created = not existed.exists()
    try:
        secret = secret_set(
            tenant=context.tenant,
            name=name,
            value=value,
            actor=context.user,
            remote_addr=remote_addr(request),
        )
    except SecretInputError as exc:
        raise ValidationError({exc.field: [str(exc)]}) from None
    except SecretKeysUnavailable as exc:
        raise SecretStoreUnavailable(str(exc)) from None
    return Response(
        SecretOutputSerializer(secret).data,
        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
    )


class SecretListApi(APIView):
    gate: Gate = {"GET": Action.SECRET_READ, "POST": Action.SECRET_WRITE}

    @extend_schema(responses=SecretOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        secrets = selectors.secret_list_for(tenant=tenant_of(request).tenant)
        return Response(SecretOutputSerializer(secrets, many=True).data)

    @extend_schema(
        request=SecretCreateInputSerializer,
        responses={200: SecretOutputSerializer, 201: SecretOutputSerializer},
        description="Set a secret (create or replace); the value is never returned.",
    )
    def post(self, request: Request) -> Response:
        reject_unknown_fields(request, {"name", "value"})
        body = SecretCreateInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        return _set(request, data["name"], data["value"])


class SecretDetailApi(APIView):
    gate: Gate = {
        "GET": Action.SECRET_READ,
        "PUT": Action.SECRET_WRITE,
        "DELETE": Action.SECRET_WRITE,
    }

    @extend_schema(parameters=[NAME_PARAMETER], responses=SecretOutputSerializer)
    def get(self, request: Request, name: str) -> Response:
        return Response(SecretOutputSerializer(_secret_of(request, name)).data)

    @extend_schema(
        parameters=[NAME_PARAMETER],
        request=_ValueInput,
        responses={200: SecretOutputSerializer, 201: SecretOutputSerializer},
        description="Set the secret (create or replace); the value is never returned.",
    )
    def put(self, request: Request, name: str) -> Response:
        reject_unknown_fields(request, {"value"})
        body = _ValueInput(data=request.data)
        body.is_valid(raise_exception=True)
        return _set(request, name, body.validated_data["value"])

    @extend_schema(parameters=[NAME_PARAMETER], request=None, responses={204: None})
    def delete(self, request: Request, name: str) -> Response:
        context = tenant_of(request)
        _secret_of(request, name)  # 404 before the write: nothing to audit
        secret_delete(
            tenant=context.tenant,
            name=name,
            actor=context.user,
            remote_addr=remote_addr(request),
        )
        return Response(status=status.HTTP_204_NO_CONTENT)
