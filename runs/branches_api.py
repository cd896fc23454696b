"""Retry, fork and a session's branches (docs/api.md "Retry and fork"):
`POST /api/v1/runs/<id>/retry/`, `POST /api/v1/runs/<id>/fork/` and
`GET /api/v1/runs/<id>/branches/`."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs.api import (
    RunConflictSerializer,
    RunSerializer,
    run_conflict_response,
    run_or_404,
)
from runs.branch_selectors import run_branches_for
from runs.services.branches import (
    MAX_EDIT_CHARS,
    BranchRefused,
    edit_problem,
    run_fork,
    run_retry,
)
from runs.services.lifecycle import RunConflict


class ForkSerializer(serializers.Serializer[Any]):
    from_entry = serializers.RegexField(
        r"^[0-9a-f]{8}$",
        required=False,
        help_text="the session entry (8 hex digits) to fork from",
    )
    from_step = serializers.IntegerField(
        required=False, min_value=0, help_text="the run's step to fork from"
    )
    call_id = serializers.CharField(
        required=False,
        max_length=200,
        help_text="with from_step and tool_result: which call's result, when "
        "the step made more than one",
    )
    message = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=MAX_EDIT_CHARS,
        help_text="the user or assistant message's new text",
    )
    tool_result = serializers.JSONField(
        required=False,
        help_text="the tool result the model sees instead (text, or JSON data)",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("from_entry" in attrs) == ("from_step" in attrs):
            raise ValidationError({"from_entry": ["give from_entry or from_step"]})
        if "message" in attrs and "tool_result" in attrs:
            raise ValidationError(
                {"message": ["give message or tool_result, not both"]}
            )
        if "call_id" in attrs and "from_step" not in attrs:
            raise ValidationError({"call_id": ["call_id goes with from_step"]})
        problem = edit_problem(attrs.get("message"), attrs.get("tool_result"))
        if problem is not None:
            raise ValidationError({problem[0]: [problem[1]]})
        return attrs


class BranchSerializer(serializers.Serializer[Any]):
    run = serializers.UUIDField()
    number = serializers.IntegerField(help_text="0: the session's first run")
    kind = serializers.ChoiceField(choices=["root", "retry", "fork"])
    branch_of = serializers.UUIDField(allow_null=True)
    from_entry = serializers.CharField(
        allow_null=True, help_text="the entry its log continues after"
    )
    edit = serializers.JSONField(allow_null=True)
    status = serializers.CharField()
    stop_reason = serializers.CharField()
    steps = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    current = serializers.BooleanField(help_text="the run the request named")


class RunRetryApi(APIView):
    gate: Gate = {"POST": Action.RUN_START}

    @extend_schema(
        request=None, responses={201: RunSerializer, 409: RunConflictSerializer}
    )
    def post(self, request: Request, run_id: str) -> Response:
        run = run_or_404(request, run_id)
        try:
            branch = run_retry(run=run, actor=tenant_of(request).user)
        except RunConflict as exc:
            return run_conflict_response(exc)
        return Response(RunSerializer(branch).data, status=status.HTTP_201_CREATED)


class RunForkApi(APIView):
    gate: Gate = {"POST": Action.RUN_START}

    @extend_schema(
        request=ForkSerializer,
        responses={201: RunSerializer, 409: RunConflictSerializer},
    )
    def post(self, request: Request, run_id: str) -> Response:
        run = run_or_404(request, run_id)
        body = ForkSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            branch = run_fork(
                run=run,
                actor=tenant_of(request).user,
                from_entry=data.get("from_entry"),
                from_step=data.get("from_step"),
                call_id=data.get("call_id"),
                message=data.get("message"),
                tool_result=data.get("tool_result"),
            )
        except BranchRefused as refused:
            raise ValidationError({refused.field: [refused.message]}) from refused
        except RunConflict as exc:
            return run_conflict_response(exc)
        return Response(RunSerializer(branch).data, status=status.HTTP_201_CREATED)


class RunBranchesApi(APIView):
    gate: Gate = {"GET": Action.RUN_READ}

    @extend_schema(responses=BranchSerializer(many=True))
    def get(self, request: Request, run_id: str) -> Response:
        rows = run_branches_for(tenant=tenant_of(request).tenant, run_id=run_id)
        if rows is None:
            raise NotFound("No such run in this tenant.")
        return Response(BranchSerializer(rows, many=True).data)
