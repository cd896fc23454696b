"""Approvals API: list and decide approval requests, edit the tenant's approval
policy, and read the tenant's audit log."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals import rules, selectors, services
from approvals.models import ApprovalRequest, TenantApprovalSettings
from controlplane.api_input import BoundedPagination, query_params
from controlplane.api_schema import ErrorDetailSerializer
from controlplane.idempotency import (
    IDEMPOTENCY_KEY_PARAMETER,
    IDEMPOTENCY_KEY_REUSED,
    idempotent,
)
from controlplane.permissions import Action, Gate, roles_that_may
from controlplane.tenancy import tenant_of
from tracing.redaction import ArgsDigestField, RedactedCharField, RedactedJSONField


def _remote_addr(request: Request) -> str | None:
    return request.META.get("REMOTE_ADDR") or None


def _reject_unknown_fields(request: Request, allowed: set[str]) -> None:
    if not isinstance(request.data, dict):
        raise ValidationError({"non_field_errors": ["the body must be a JSON object"]})
    unknown = sorted(set(request.data) - allowed)
    if unknown:
        raise ValidationError({name: ["unknown field"] for name in unknown})


class DecisionSerializer(serializers.Serializer[Any]):
    user = serializers.CharField(source="user.username", allow_null=True)
    decision = serializers.CharField()
    reason = RedactedCharField()
    args_sha256 = ArgsDigestField()
    created_at = serializers.DateTimeField()


class ApprovalSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    kind = serializers.CharField()
    # What is being decided, in a few words: the tool, or "extend <dimension> by X".
    summary = serializers.SerializerMethodField()
    # For a budget extension: scope, dimension, name, amount, limit, used, wanted,
    # stop_reason, detail, period, bucket_start; null for a tool call.
    extension = RedactedJSONField(allow_null=True)
    run = serializers.UUIDField(source="run_id")
    run_status = serializers.CharField(source="run.status")
    tool_call_id = serializers.CharField(
        source="tool_call.call_id", allow_null=True, default=None
    )
    tool = serializers.CharField(source="tool_name")
    # Redacted: the snapshot keeps what the tool executes with. An approver who
    # edits sends the shown values back and the service restores what they hide.
    args = RedactedJSONField(source="args_snapshot")
    # Keyed: the plain sha256 of arguments with one value hidden would let a
    # reader test guesses of that value.
    args_sha256 = ArgsDigestField()
    original_args = RedactedJSONField()
    args_edited_by = serializers.CharField(
        source="args_edited_by.username", allow_null=True, default=None
    )
    rule = serializers.CharField()
    rule_reason = RedactedCharField()
    approver_roles = serializers.JSONField()
    approvals_required = serializers.IntegerField()
    status = serializers.CharField()
    scope = serializers.CharField()
    requested_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    decided_by = serializers.CharField(
        source="decided_by.username", allow_null=True, default=None
    )
    decided_at = serializers.DateTimeField(allow_null=True)
    reason = RedactedCharField()
    decisions = DecisionSerializer(many=True, source="decisions.all")

    def get_summary(self, approval: ApprovalRequest) -> str:
        if approval.extension is not None:
            return services.extension_summary(approval.extension)
        return approval.tool_name


class ApprovalConflictDetailSerializer(ErrorDetailSerializer):
    approval = ApprovalSerializer()


class ApprovalConflictSerializer(serializers.Serializer[Any]):
    """409: already decided; `approval` is as it is now."""

    error = ApprovalConflictDetailSerializer()


class ApprovalListApi(APIView):
    gate: Gate = {"GET": Action.APPROVAL_READ}
    pagination_class = BoundedPagination

    class ApprovalListQuerySerializer(serializers.Serializer[Any]):
        status = serializers.ChoiceField(
            choices=ApprovalRequest.Status.values, required=False, allow_blank=True
        )
        run = serializers.UUIDField(required=False, help_text="a run's id")

    @extend_schema(
        parameters=[ApprovalListQuerySerializer],
        responses=ApprovalSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        context = tenant_of(request)
        wanted = query_params(request, self.ApprovalListQuerySerializer)
        approvals = selectors.approval_list_for(
            tenant=context.tenant,
            status=wanted.get("status"),
            run_id=wanted.get("run"),
        ).prefetch_related("decisions__user")
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(approvals, request, view=self)
        return paginator.get_paginated_response(
            ApprovalSerializer(page, many=True).data
        )


class ApprovalDetailApi(APIView):
    gate: Gate = {"GET": Action.APPROVAL_READ}

    @extend_schema(responses=ApprovalSerializer)
    def get(self, request: Request, approval_id: str) -> Response:
        context = tenant_of(request)
        approval = get_object_or_404(
            selectors.approval_list_for(tenant=context.tenant), id=approval_id
        )
        return Response(ApprovalSerializer(approval).data)


class ApprovalDecideApi(APIView):
    gate: Gate = {"POST": Action.APPROVAL_DECIDE}

    class DecideInputSerializer(serializers.Serializer[Any]):
        decision = serializers.ChoiceField(choices=["approve", "deny"])
        reason = serializers.CharField(
            required=False, default="", allow_blank=True, max_length=2000
        )
        scope = serializers.ChoiceField(
            choices=ApprovalRequest.Scope.values, required=False, default="once"
        )
        args = serializers.JSONField(required=False, default=None)

    @extend_schema(
        request=DecideInputSerializer,
        parameters=[IDEMPOTENCY_KEY_PARAMETER],
        responses={
            200: ApprovalSerializer,
            409: ApprovalConflictSerializer,
            422: IDEMPOTENCY_KEY_REUSED,
        },
    )
    def post(self, request: Request, approval_id: str) -> Response:
        context = tenant_of(request)
        approval = get_object_or_404(
            selectors.approval_list_for(tenant=context.tenant), id=approval_id
        )
        return idempotent(
            request,
            tenant=context.tenant,
            operation=f"approval.decide {approval.id}",
            respond=lambda: self._decide(request, approval),
        )

    def _decide(self, request: Request, approval: ApprovalRequest) -> Response:
        context = tenant_of(request)
        _reject_unknown_fields(request, {"decision", "reason", "scope", "args"})
        body = self.DecideInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            decided = services.approval_decide(
                request=approval,
                decided_by=context.user,
                approve=data["decision"] == "approve",
                reason=data["reason"],
                scope=data["scope"],
                args=data["args"],
                remote_addr=_remote_addr(request),
            )
        except services.AlreadyDecided as conflict:
            current = selectors.approval_list_for(tenant=context.tenant).get(
                id=approval.id
            )
            return Response(
                {
                    "error": {
                        "code": "already_decided",
                        "message": str(conflict),
                        "approval": ApprovalSerializer(current).data,
                    }
                },
                status=status.HTTP_409_CONFLICT,
            )
        except services.ApprovalForbidden as refused:
            raise PermissionDenied(str(refused)) from None
        except services.ApprovalInputError as invalid:
            raise ValidationError({invalid.field: [str(invalid)]}) from None
        fresh = selectors.approval_list_for(tenant=context.tenant).get(id=decided.id)
        return Response(ApprovalSerializer(fresh).data)


class RuleSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    position = serializers.IntegerField()
    name = serializers.CharField()
    tool = serializers.CharField()
    effects = serializers.JSONField()
    source = serializers.CharField()  # type: ignore[assignment]  # the rule field
    conditions = serializers.JSONField()
    action = serializers.CharField()
    ttl_seconds = serializers.IntegerField(allow_null=True)
    approver_roles = serializers.JSONField()
    approvals_required = serializers.IntegerField()
    starter_may_approve = serializers.BooleanField()
    updated_at = serializers.DateTimeField()


class RuleInputSerializer(serializers.Serializer[Any]):
    """For the schema only: `approvals.rules.rule_validate` checks the body."""

    position = serializers.IntegerField(required=False)
    name = serializers.CharField()
    tool = serializers.CharField(required=False, help_text="glob on the tool name")
    effects = serializers.ListField(child=serializers.CharField(), required=False)
    source = serializers.ChoiceField(  # type: ignore[assignment]  # the rule field
        choices=["any", "trusted", "untrusted"], required=False
    )
    conditions = serializers.ListField(
        child=serializers.DictField(), required=False,
        help_text='[{"arg": "amount", "op": ">", "value": 100}]',
    )  # fmt: skip
    action = serializers.ChoiceField(choices=["allow", "require_approval", "deny"])
    ttl_seconds = serializers.IntegerField(required=False, allow_null=True)
    approver_roles = serializers.ListField(
        child=serializers.ChoiceField(choices=roles_that_may(Action.APPROVAL_DECIDE)),
        required=False,
    )
    approvals_required = serializers.IntegerField(required=False)
    starter_may_approve = serializers.BooleanField(required=False)


RULE_INPUT_DOC = RuleInputSerializer


class ApprovalRuleListApi(APIView):
    gate: Gate = {"GET": Action.POLICY_READ, "POST": Action.POLICY_WRITE}

    @extend_schema(responses=RuleSerializer(many=True))
    def get(self, request: Request) -> Response:
        context = tenant_of(request)
        found = selectors.approval_rules_for(tenant=context.tenant)
        return Response(RuleSerializer(found, many=True).data)

    @extend_schema(request=RULE_INPUT_DOC, responses={201: RuleSerializer})
    def post(self, request: Request) -> Response:
        context = tenant_of(request)
        try:
            rule = rules.approval_rule_create(
                tenant=context.tenant,
                actor=context.user,
                data=request.data,
                remote_addr=_remote_addr(request),
            )
        except rules.RuleInputError as invalid:
            raise ValidationError(invalid.fields) from None
        return Response(RuleSerializer(rule).data, status=status.HTTP_201_CREATED)


class ApprovalRuleDetailApi(APIView):
    gate: Gate = {
        "GET": Action.POLICY_READ,
        "PATCH": Action.POLICY_WRITE,
        "DELETE": Action.POLICY_WRITE,
    }

    @extend_schema(responses=RuleSerializer)
    def get(self, request: Request, rule_id: str) -> Response:
        context = tenant_of(request)
        rule = get_object_or_404(
            selectors.approval_rules_for(tenant=context.tenant), id=rule_id
        )
        return Response(RuleSerializer(rule).data)

    @extend_schema(request=RULE_INPUT_DOC, responses=RuleSerializer)
    def patch(self, request: Request, rule_id: str) -> Response:
        context = tenant_of(request)
        rule = get_object_or_404(
            selectors.approval_rules_for(tenant=context.tenant), id=rule_id
        )
        try:
            rule = rules.approval_rule_update(
                rule=rule,
                actor=context.user,
                data=request.data,
                remote_addr=_remote_addr(request),
            )
        except rules.RuleInputError as invalid:
            raise ValidationError(invalid.fields) from None
        return Response(RuleSerializer(rule).data)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, rule_id: str) -> Response:
        context = tenant_of(request)
        rule = get_object_or_404(
            selectors.approval_rules_for(tenant=context.tenant), id=rule_id
        )
        rules.approval_rule_delete(
            rule=rule, actor=context.user, remote_addr=_remote_addr(request)
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class ApprovalSettingsApi(APIView):
    class ApprovalSettingsSerializer(serializers.Serializer[Any]):
        deny_reason_required = serializers.BooleanField()

    gate: Gate = {"GET": Action.POLICY_READ, "PUT": Action.POLICY_WRITE}

    @extend_schema(responses=ApprovalSettingsSerializer)
    def get(self, request: Request) -> Response:
        context = tenant_of(request)
        current = TenantApprovalSettings.objects.filter(tenant=context.tenant).first()
        required = bool(current and current.deny_reason_required)
        return Response({"deny_reason_required": required})

    @extend_schema(
        request=ApprovalSettingsSerializer, responses=ApprovalSettingsSerializer
    )
    def put(self, request: Request) -> Response:
        context = tenant_of(request)
        _reject_unknown_fields(request, {"deny_reason_required"})
        body = self.ApprovalSettingsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        saved = rules.approval_settings_set(
            tenant=context.tenant,
            actor=context.user,
            deny_reason_required=body.validated_data["deny_reason_required"],
            remote_addr=_remote_addr(request),
        )
        return Response({"deny_reason_required": saved.deny_reason_required})


class AuditEventSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    actor = serializers.CharField(
        source="actor.username", allow_null=True, default=None
    )
    action = serializers.CharField()
    object_type = serializers.CharField()
    object_id = serializers.CharField()
    before = RedactedJSONField()
    after = RedactedJSONField()
    remote_addr = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()


class AuditListApi(APIView):
    """The tenant's audit log, newest first (admins only)."""

    gate: Gate = {"GET": Action.AUDIT_READ}
    pagination_class = BoundedPagination

    class AuditListQuerySerializer(serializers.Serializer[Any]):
        # An empty value means no filter, as it always has.
        action = serializers.CharField(required=False, allow_blank=True, max_length=64)
        object_type = serializers.CharField(
            required=False, allow_blank=True, max_length=64
        )
        object_id = serializers.CharField(
            required=False, allow_blank=True, max_length=64
        )

    @extend_schema(
        parameters=[AuditListQuerySerializer],
        responses=AuditEventSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        context = tenant_of(request)
        wanted = query_params(request, self.AuditListQuerySerializer)
        events = selectors.audit_events_for(
            tenant=context.tenant,
            action=wanted.get("action") or None,
            object_type=wanted.get("object_type") or None,
            object_id=wanted.get("object_id") or None,
        )
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(events, request, view=self)
        return paginator.get_paginated_response(
            AuditEventSerializer(page, many=True).data
        )
