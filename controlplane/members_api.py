"""The tenant's members over the API (admins only): list, invite by email,
create an account, set a role, deactivate and reactivate, a new password link.

A member's `id` is their membership in this tenant; another tenant's id is a
404. A password link's token is in the answer that made it, once.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.validators import UnicodeUsernameValidator
from django.http import Http404
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane import members
from controlplane.api_errors import error_body
from controlplane.api_input import remote_addr
from controlplane.api_schema import ErrorSerializer
from controlplane.models import Membership, Role
from controlplane.password_links import IssuedPasswordLink, password_link_send
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of

# Ids are 64-bit in the database; a larger one is no member (not a 500).
_MAX_ID = 2**63 - 1


class MemberSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField(help_text="the membership's id in this tenant")
    user_id = serializers.IntegerField()
    username = serializers.CharField(source="user.username")
    email = serializers.CharField(source="user.email")
    role = serializers.ChoiceField(choices=Role.choices)
    active = serializers.SerializerMethodField()
    password_set = serializers.SerializerMethodField()
    password_link_expires_at = serializers.DateTimeField(
        allow_null=True,
        default=None,
        help_text="when the member's waiting password link expires (null: none)",
    )
    last_login = serializers.DateTimeField(source="user.last_login", allow_null=True)
    created_at = serializers.DateTimeField()
    deactivated_at = serializers.DateTimeField(allow_null=True)

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_active(self, membership: Membership) -> bool:
        return membership.deactivated_at is None

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_password_set(self, membership: Membership) -> bool:
        return membership.user.has_usable_password()


class PasswordLinkSerializer(serializers.Serializer[Any]):
    token = serializers.CharField(help_text="the link's secret; shown this once only")
    url = serializers.CharField(help_text="the page where the member sets a password")
    expires_at = serializers.DateTimeField()
    emailed = serializers.BooleanField(
        help_text="sent by email (PASSWORD_LINK_EMAIL_FROM); else pass it on yourself"
    )


class MemberAddedSerializer(serializers.Serializer[Any]):
    member = MemberSerializer()
    account_created = serializers.BooleanField()
    password_link = PasswordLinkSerializer(
        allow_null=True,
        help_text="null: the account has a password already (or belongs to "
        "another tenant too) and logs in with it",
    )


def _role_field() -> serializers.ChoiceField:
    return serializers.ChoiceField(choices=Role.choices)


def _member_or_404(request: Request, member_id: int) -> Membership:
    context = tenant_of(request)
    found = (
        members.member_get(tenant=context.tenant, member_id=member_id)
        if 0 < member_id <= _MAX_ID
        else None
    )
    if found is None:
        raise Http404("No such member in this tenant.")
    return found


def _fresh(membership: Membership) -> Membership:
    """The member as the list shows them (with their waiting link's expiry)."""
    found = members.member_get(tenant=membership.tenant, member_id=membership.id)
    return found or membership


def _member_data(membership: Membership) -> dict[str, Any]:
    return dict(MemberSerializer(_fresh(membership)).data)


def _link_data(request: Request, issued: IssuedPasswordLink) -> dict[str, Any]:
    path = reverse("password-link-accept", args=[issued.token])
    url = request.build_absolute_uri(path)
    link = issued.link
    emailed = password_link_send(user=link.user, tenant=link.tenant, url=url)
    return {
        "token": issued.token,
        "url": url,
        "expires_at": link.expires_at,
        "emailed": emailed,
    }


def _added(request: Request, added: members.MemberAdded) -> Response:
    data = {
        "member": _fresh(added.membership),
        "account_created": added.user_created,
        "password_link": _link_data(request, added.link) if added.link else None,
    }
    return Response(MemberAddedSerializer(data).data, status=status.HTTP_201_CREATED)


def _conflict(exc: members.MemberConflict) -> Response:
    return Response(error_body(exc.code, exc.message), status=status.HTTP_409_CONFLICT)


class MemberListApi(APIView):
    """The tenant's members, deactivated ones too; POST creates a new account."""

    gate: Gate = {"GET": Action.MEMBER_MANAGE, "POST": Action.MEMBER_MANAGE}

    class MemberCreateInputSerializer(serializers.Serializer[Any]):
        username = serializers.CharField(
            max_length=150, validators=[UnicodeUsernameValidator()]
        )
        email = serializers.EmailField(required=False, allow_blank=True, default="")
        role = _role_field()

    @extend_schema(responses=MemberSerializer(many=True))
    def get(self, request: Request) -> Response:
        context = tenant_of(request)
        rows = members.members_of(tenant=context.tenant)
        return Response(MemberSerializer(rows, many=True).data)

    @extend_schema(
        request=MemberCreateInputSerializer,
        responses={201: MemberAddedSerializer},
        description="Create an account in this tenant with a one-time link to "
        "set its password (the link's token is in this answer only).",
    )
    def post(self, request: Request) -> Response:
        context = tenant_of(request)
        body = self.MemberCreateInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            added = members.member_create(
                tenant=context.tenant,
                username=body.validated_data["username"],
                email=body.validated_data["email"],
                role=body.validated_data["role"],
                actor=context.user,
                remote_addr=remote_addr(request),
            )
        except members.MemberInputError as exc:
            raise ValidationError({exc.field: [exc.message]}) from None
        return _added(request, added)


class MemberInviteApi(APIView):
    gate: Gate = {"POST": Action.MEMBER_MANAGE}

    class MemberInviteInputSerializer(serializers.Serializer[Any]):
        email = serializers.EmailField(max_length=254)
        role = _role_field()

    @extend_schema(
        request=MemberInviteInputSerializer,
        responses={201: MemberAddedSerializer},
        description="Add the account with this email to the tenant, creating it "
        "(named by the email) when there is none. An account without a password "
        "gets a one-time link to set one.",
    )
    def post(self, request: Request) -> Response:
        context = tenant_of(request)
        body = self.MemberInviteInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            added = members.member_invite(
                tenant=context.tenant,
                email=body.validated_data["email"],
                role=body.validated_data["role"],
                actor=context.user,
                remote_addr=remote_addr(request),
            )
        except members.MemberInputError as exc:
            raise ValidationError({exc.field: [exc.message]}) from None
        return _added(request, added)


class MemberDetailApi(APIView):
    gate: Gate = {"GET": Action.MEMBER_MANAGE}

    @extend_schema(responses=MemberSerializer)
    def get(self, request: Request, member_id: int) -> Response:
        return Response(MemberSerializer(_member_or_404(request, member_id)).data)


class MemberRoleApi(APIView):
    gate: Gate = {"POST": Action.MEMBER_MANAGE}

    class MemberRoleInputSerializer(serializers.Serializer[Any]):
        role = _role_field()

    @extend_schema(
        request=MemberRoleInputSerializer,
        responses={200: MemberSerializer, 409: ErrorSerializer},
        description="409 (code last_admin): the member is the tenant's last "
        "active admin.",
    )
    def post(self, request: Request, member_id: int) -> Response:
        membership = _member_or_404(request, member_id)
        body = self.MemberRoleInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            changed = members.member_role_set(
                membership=membership,
                role=body.validated_data["role"],
                actor=tenant_of(request).user,
                remote_addr=remote_addr(request),
            )
        except members.MemberConflict as exc:
            return _conflict(exc)
        return Response(_member_data(changed))


class MemberDeactivateApi(APIView):
    gate: Gate = {"POST": Action.MEMBER_MANAGE}

    @extend_schema(
        request=None,
        responses={200: MemberSerializer, 409: ErrorSerializer},
        description="The member can no longer log in to or call this tenant; "
        "their tokens are refused and open streams close. 409 (code last_admin): "
        "the member is the tenant's last active admin.",
    )
    def post(self, request: Request, member_id: int) -> Response:
        membership = _member_or_404(request, member_id)
        try:
            changed = members.member_deactivate(
                membership=membership,
                actor=tenant_of(request).user,
                remote_addr=remote_addr(request),
            )
        except members.MemberConflict as exc:
            return _conflict(exc)
        return Response(_member_data(changed))


class MemberReactivateApi(APIView):
    gate: Gate = {"POST": Action.MEMBER_MANAGE}

    @extend_schema(request=None, responses=MemberSerializer)
    def post(self, request: Request, member_id: int) -> Response:
        membership = _member_or_404(request, member_id)
        changed = members.member_reactivate(
            membership=membership,
            actor=tenant_of(request).user,
            remote_addr=remote_addr(request),
        )
        return Response(_member_data(changed))


class MemberPasswordLinkApi(APIView):
    gate: Gate = {"POST": Action.MEMBER_MANAGE}

    @extend_schema(
        request=None,
        responses={201: PasswordLinkSerializer, 409: ErrorSerializer},
        description="A new one-time password link for a member who has not set "
        "a password (the one before it stops working). 409: the member has a "
        "password, belongs to another tenant too, or is deactivated.",
    )
    def post(self, request: Request, member_id: int) -> Response:
        membership = _member_or_404(request, member_id)
        try:
            issued = members.password_link_reissue(
                membership=membership,
                actor=tenant_of(request).user,
                remote_addr=remote_addr(request),
            )
        except members.MemberConflict as exc:
            return _conflict(exc)
        return Response(
            PasswordLinkSerializer(_link_data(request, issued)).data,
            status=status.HTTP_201_CREATED,
        )
