"""Tenant-level API: who am I, and my API tokens."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane import selectors, services
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of


class MeApi(APIView):
    gate: Gate = {"GET": Action.TENANT_READ}

    class MeSerializer(serializers.Serializer[Any]):
        username = serializers.CharField()
        tenant = serializers.CharField()
        role = serializers.CharField()
        tenants = serializers.ListField(child=serializers.DictField())
        auth = serializers.CharField()

    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        context = tenant_of(request)
        memberships = selectors.memberships_of(user=context.user)
        data = {
            "username": context.user.get_username(),
            "tenant": context.tenant.slug,
            "role": context.role,
            "tenants": [
                {"slug": m.tenant.slug, "name": m.tenant.name, "role": m.role}
                for m in memberships
            ],
            "auth": "token" if context.token else "session",
        }
        return Response(self.MeSerializer(data).data)


class TokenOutputSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    name = serializers.CharField()
    prefix = serializers.CharField()
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)


class TokenIssuedSerializer(TokenOutputSerializer):
    token = serializers.CharField(help_text="the secret; shown this once only")


class TokenListApi(APIView):
    gate: Gate = {"GET": Action.TOKEN_MANAGE, "POST": Action.TOKEN_MANAGE}

    # Named for the schema: two nested "InputSerializer"s made one "Input"
    # component, and this endpoint was documented with the run's required fields.
    class TokenIssueInputSerializer(serializers.Serializer[Any]):
        name = serializers.CharField(max_length=100, required=False, default="")

    @extend_schema(responses=TokenOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        context = tenant_of(request)
        tokens = selectors.api_tokens_for(tenant=context.tenant, user=context.user)
        return Response(TokenOutputSerializer(tokens, many=True).data)

    @extend_schema(
        request=TokenIssueInputSerializer, responses={201: TokenIssuedSerializer}
    )
    def post(self, request: Request) -> Response:
        context = tenant_of(request)
        body = self.TokenIssueInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        issued = services.api_token_issue(
            tenant=context.tenant, user=context.user, name=body.validated_data["name"]
        )
        data = dict(TokenOutputSerializer(issued.token).data)
        data["token"] = issued.secret  # shown once
        return Response(data, status=status.HTTP_201_CREATED)


class TokenRevokeApi(APIView):
    gate: Gate = {"POST": Action.TOKEN_MANAGE}

    @extend_schema(request=None, responses=TokenOutputSerializer)
    def post(self, request: Request, token_id: str) -> Response:
        context = tenant_of(request)
        token = get_object_or_404(
            selectors.api_tokens_for(tenant=context.tenant, user=context.user),
            id=token_id,
        )
        token = services.api_token_revoke(token=token, actor=context.user)
        return Response(TokenOutputSerializer(token).data)
