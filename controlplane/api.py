"""Tenant-level API: who am I, and API tokens (a member's own; an admin's view
takes in every member's)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane import members, selectors, services
from controlplane.api_input import remote_addr
from controlplane.models import ApiToken
from controlplane.permissions import Action, Gate, context_may
from controlplane.tenancy import TenantContext, tenant_of


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
    prefix = serializers.CharField(help_text="the secret's first characters")
    owner = serializers.CharField(source="user.username")
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)
    revoked_by = serializers.CharField(
        source="revoked_by.username", allow_null=True, default=None
    )


class TokenIssuedSerializer(TokenOutputSerializer):
    token = serializers.CharField(help_text="the secret; shown this once only")


def tokens_visible_to(context: TenantContext) -> QuerySet[ApiToken]:
    """An admin sees every member's tokens in the tenant; others their own (so
    another member's token id is a 404 to them)."""
    if context_may(context, Action.TOKEN_MANAGE_ANY):
        return selectors.api_tokens_of_tenant(tenant=context.tenant)
    return selectors.api_tokens_for(tenant=context.tenant, user=context.user)


class TokenListApi(APIView):
    gate: Gate = {"GET": Action.TOKEN_MANAGE, "POST": Action.TOKEN_MANAGE}

    # Named for the schema: two nested "InputSerializer"s made one "Input"
    # component, and this endpoint was documented with the run's required fields.
    class TokenIssueInputSerializer(serializers.Serializer[Any]):
        name = serializers.CharField(max_length=100, required=False, default="")
        member = serializers.IntegerField(
            required=False,
            allow_null=True,
            default=None,
            min_value=1,
            max_value=2**63 - 1,
            help_text="admins: the member (id) the token is for; default yourself",
        )

    @extend_schema(
        responses=TokenOutputSerializer(many=True),
        description="Your tokens; for an admin, every member's in the tenant. "
        "Revoked ones too; never a secret.",
    )
    def get(self, request: Request) -> Response:
        tokens = tokens_visible_to(tenant_of(request))
        return Response(TokenOutputSerializer(tokens, many=True).data)

    @extend_schema(
        request=TokenIssueInputSerializer, responses={201: TokenIssuedSerializer}
    )
    def post(self, request: Request) -> Response:
        context = tenant_of(request)
        body = self.TokenIssueInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        owner = context.user
        member_id = body.validated_data["member"]
        if member_id is not None:
            membership = members.member_get(tenant=context.tenant, member_id=member_id)
            own = membership is not None and membership.user_id == context.user.id
            # Asked first: to a non-admin, any other id is the same 403.
            if not own and not context_may(context, Action.TOKEN_MANAGE_ANY):
                raise PermissionDenied("Only admins issue tokens for other members.")
            if membership is None:
                raise ValidationError({"member": ["no such member in this tenant"]})
            if membership.deactivated_at is not None:
                raise ValidationError({"member": ["the member is deactivated"]})
            owner = membership.user
        issued = services.api_token_issue(
            tenant=context.tenant,
            user=owner,
            name=body.validated_data["name"],
            actor=context.user,
            remote_addr=remote_addr(request),
        )
        data = dict(TokenOutputSerializer(issued.token).data)
        data["token"] = issued.secret  # shown once
        return Response(data, status=status.HTTP_201_CREATED)


class TokenRevokeApi(APIView):
    gate: Gate = {"POST": Action.TOKEN_MANAGE}

    @extend_schema(
        request=None,
        responses=TokenOutputSerializer,
        description="Revoked at once: the next request with it gets 401. Your "
        "own token, or (admins) any member's.",
    )
    def post(self, request: Request, token_id: str) -> Response:
        context = tenant_of(request)
        token = get_object_or_404(tokens_visible_to(context), id=token_id)
        token = services.api_token_revoke(
            token=token, actor=context.user, remote_addr=remote_addr(request)
        )
        return Response(TokenOutputSerializer(token).data)
