"""Approvals API: list and read approval requests and the tenant's approval
settings, and the serializers of requests and rules.

Deciding (which resumes the run) and writing rules (checked against the tool
registry) act on runs: runs/approvals_api.py serves them at the same URLs.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals import rules, selectors, services
from approvals.models import ApprovalRequest, TenantApprovalSettings
from approvals.policy import APPROVER_ROLE_CHOICES
from controlplane.api_input import (
    BoundedPagination,
    query_params,
    reject_unknown_fields,
    remote_addr,
)
from controlplane.api_schema import ErrorDetailSerializer
from controlplane.permissions import Action, Gate
from controlplane.redaction import (
    ArgsDigestField,
    RedactedCharField,
    RedactedJSONField,
    redact_text,
)
from controlplane.tenancy import tenant_of


class DecisionSerializer(serializers.Serializer[Any]):
    user = serializers.CharField(source="user.username", allow_null=True)
    decision = serializers.CharField()
    reason = RedactedCharField()
    args_sha256 = ArgsDigestField()
    created_at = serializers.DateTimeField()


CONTEXT_CHARS = 2000  # the inbox shows context, the run page the whole text


def _bounded(text: str) -> str:
    return text if len(text) <= CONTEXT_CHARS else text[: CONTEXT_CHARS - 1] + "…"


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
    # Context for the person deciding: which agent, what the run was asked, and
    # what the model said when it made the call (redacted, bounded).
    agent = serializers.CharField(source="run.agent.slug")
    # A sub-agent run's call: the run it serves (its parent's); null otherwise.
    parent_run = serializers.UUIDField(source="run.parent_run_id", allow_null=True)
    run_input = serializers.SerializerMethodField()
    last_model_message = serializers.SerializerMethodField()
    # The call's id on the trace: the model's call id, or an external call's
    # request id (the approval span carries it as gen_ai.tool.call.id).
    tool_call_id = serializers.SerializerMethodField()
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

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_tool_call_id(self, approval: ApprovalRequest) -> str | None:
        return services.call_id_of(approval)

    def get_run_input(self, approval: ApprovalRequest) -> str:
        return redact_text(_bounded(approval.run.input))

    def get_last_model_message(self, approval: ApprovalRequest) -> str | None:
        """The text of the model reply that asked for the call; None when the
        call came with no text, or the request is not about one call."""
        call = approval.tool_call
        reply = call.step.reply if call is not None else None
        text = reply.get("text") if isinstance(reply, dict) else None
        return redact_text(_bounded(text)) if isinstance(text, str) and text else None

    def get_summary(self, approval: ApprovalRequest) -> str:
        if approval.extension is not None:
            return services.extension_summary(approval.extension)
        if approval.kind == ApprovalRequest.Kind.TOOL_ERROR:
            return f"{approval.tool_name} failed repeatedly: go on?"
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
            choices=[*ApprovalRequest.Status.values, selectors.DECIDED],
            required=False,
            allow_blank=True,
            help_text="`decided`: every request no longer pending, last decided first",
        )
        decided_by = serializers.CharField(
            required=False, max_length=150, help_text="the decider's username"
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
            decided_by=wanted.get("decided_by"),
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
        child=serializers.ChoiceField(choices=APPROVER_ROLE_CHOICES), required=False
    )
    approvals_required = serializers.IntegerField(required=False)
    starter_may_approve = serializers.BooleanField(required=False)


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
        reject_unknown_fields(request, {"deny_reason_required"})
        body = self.ApprovalSettingsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        saved = rules.approval_settings_set(
            tenant=context.tenant,
            actor=context.user,
            deny_reason_required=body.validated_data["deny_reason_required"],
            remote_addr=remote_addr(request),
        )
        return Response({"deny_reason_required": saved.deny_reason_required})
