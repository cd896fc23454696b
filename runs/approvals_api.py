"""Approvals API operations that act on runs: decide an approval (then the run
resumes) and edit the tenant's approval rules (checked against the tool registry).

They live in `runs`, above `approvals`, at the same URLs as the rest of the
approvals API (approvals/api.py keeps the reads, serializers and settings).
"""

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
from approvals.api import (
    ApprovalConflictSerializer,
    ApprovalSerializer,
    RuleInputSerializer,
    RuleSerializer,
)
from approvals.models import ApprovalRequest
from controlplane.api_input import reject_unknown_fields, remote_addr
from controlplane.idempotency import (
    IDEMPOTENCY_KEY_PARAMETER,
    IDEMPOTENCY_KEY_REUSED,
    idempotent,
)
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs.engine.contracts import ToolContract
from runs.services.decide import approval_decide
from runs.tools.registry import tool_contracts_for


def _known_tools(request: Request) -> dict[str, ToolContract]:
    """The contracts a rule's conditions are checked against: the built-in tools'
    and the tenant's MCP tools'."""
    return tool_contracts_for(tenant_id=tenant_of(request).tenant.id)


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
        reject_unknown_fields(request, {"decision", "reason", "scope", "args"})
        body = self.DecideInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            decided = approval_decide(
                request=approval,
                decided_by=context.user,
                approve=data["decision"] == "approve",
                reason=data["reason"],
                scope=data["scope"],
                args=data["args"],
                remote_addr=remote_addr(request),
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


class ApprovalRuleListApi(APIView):
    gate: Gate = {"GET": Action.POLICY_READ, "POST": Action.POLICY_WRITE}

    @extend_schema(responses=RuleSerializer(many=True))
    def get(self, request: Request) -> Response:
        context = tenant_of(request)
        found = selectors.approval_rules_for(tenant=context.tenant)
        return Response(RuleSerializer(found, many=True).data)

    @extend_schema(request=RuleInputSerializer, responses={201: RuleSerializer})
    def post(self, request: Request) -> Response:
        context = tenant_of(request)
        try:
            rule = rules.approval_rule_create(
                tenant=context.tenant,
                actor=context.user,
                data=request.data,
                known_tools=_known_tools(request),
                remote_addr=remote_addr(request),
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

    @extend_schema(request=RuleInputSerializer, responses=RuleSerializer)
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
                known_tools=_known_tools(request),
                remote_addr=remote_addr(request),
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
            rule=rule, actor=context.user, remote_addr=remote_addr(request)
        )
        return Response(status=status.HTTP_204_NO_CONTENT)
