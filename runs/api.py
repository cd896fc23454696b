"""Runs API: start, list, read and cancel runs of the caller's tenant."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.budget_services import run_usage_against_caps
from controlplane.idempotency import (
    IDEMPOTENCY_KEY_PARAMETER,
    IDEMPOTENCY_KEY_REUSED,
    idempotent,
)
from controlplane.permissions import Action, action_required
from controlplane.tenancy import tenant_of
from runs import selectors, services
from runs.models import Run


class ToolCallSerializer(serializers.Serializer[Any]):
    call_id = serializers.CharField()
    tool_name = serializers.CharField()
    args = serializers.JSONField()
    status = serializers.CharField()
    effect = serializers.CharField()
    attempts = serializers.IntegerField()
    result = serializers.JSONField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class StepSerializer(serializers.Serializer[Any]):
    index = serializers.IntegerField()
    model = serializers.CharField()
    provider = serializers.CharField()
    provider_request_id = serializers.CharField()
    finish_reason = serializers.CharField()
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    cost = serializers.DecimalField(max_digits=14, decimal_places=6)
    action = serializers.JSONField()
    tool_calls = ToolCallSerializer(many=True)


class RunSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    agent = serializers.CharField(source="agent.slug")
    status = serializers.CharField()
    stop_reason = serializers.CharField()
    stop_detail = serializers.CharField()
    input = serializers.CharField()
    final_answer = serializers.CharField()
    evaluation = serializers.JSONField()
    limits = serializers.JSONField()
    steps = serializers.IntegerField()
    tool_calls = serializers.IntegerField()
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    cost = serializers.DecimalField(max_digits=14, decimal_places=6)
    started_by = serializers.CharField(source="started_by.username", allow_null=True)
    trace_id = serializers.CharField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    budget = serializers.SerializerMethodField()

    def get_budget(self, run: Run) -> dict[str, dict[str, Any]]:
        """Use against cap per dimension: {"steps": {"used": 3, "cap": 50}, ...}."""
        return run_usage_against_caps(run)


class RunDetailSerializer(RunSerializer):
    step_rows = StepSerializer(many=True, source="step_rows.all")


class RunListApi(APIView):
    class InputSerializer(serializers.Serializer[Any]):
        agent = serializers.SlugField(max_length=64)
        input = serializers.CharField(trim_whitespace=False, allow_blank=False)
        limits = serializers.DictField(required=False, default=dict)

    def get_permissions(self) -> list[Any]:
        if self.request.method == "POST":
            return [action_required(Action.RUN_START)()]
        return [action_required(Action.RUN_READ)()]

    @extend_schema(
        parameters=[
            OpenApiParameter("status", str, enum=Run.Status.values),
            OpenApiParameter("agent", str),
        ],
        responses=RunSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        context = tenant_of(request)
        status_filter = request.query_params.get("status")
        if status_filter and status_filter not in Run.Status.values:
            raise ValidationError(
                {"status": [f"unknown status; one of {', '.join(Run.Status.values)}"]}
            )
        runs = selectors.run_list_for(
            tenant=context.tenant,
            status=status_filter,
            agent=request.query_params.get("agent"),
        )
        paginator = LimitOffsetPagination()
        page = paginator.paginate_queryset(runs, request, view=self)
        return paginator.get_paginated_response(RunSerializer(page, many=True).data)

    @extend_schema(
        request=InputSerializer,
        parameters=[IDEMPOTENCY_KEY_PARAMETER],
        responses={201: RunDetailSerializer, 422: IDEMPOTENCY_KEY_REUSED},
    )
    def post(self, request: Request) -> Response:
        return idempotent(
            request,
            tenant=tenant_of(request).tenant,
            operation="run.start",
            respond=lambda: self._start(request),
        )

    def _start(self, request: Request) -> Response:
        context = tenant_of(request)
        body = self.InputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            run = services.run_start(
                tenant=context.tenant,
                agent_slug=body.validated_data["agent"],
                input=body.validated_data["input"],
                limits=body.validated_data["limits"],
                started_by=context.user,
            )
        except services.RunInputError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from exc
        found = selectors.run_get_for(tenant=context.tenant, run_id=run.id)
        return Response(RunDetailSerializer(found).data, status=status.HTTP_201_CREATED)


def _run_or_404(request: Request, run_id: str) -> Run:
    run = selectors.run_get_for(tenant=tenant_of(request).tenant, run_id=run_id)
    if run is None:
        raise NotFound("No such run in this tenant.")
    return run


class RunDetailApi(APIView):
    permission_classes = [action_required(Action.RUN_READ)]

    @extend_schema(responses=RunDetailSerializer)
    def get(self, request: Request, run_id: str) -> Response:
        return Response(RunDetailSerializer(_run_or_404(request, run_id)).data)


class RunCancelApi(APIView):
    permission_classes = [action_required(Action.RUN_CANCEL)]

    @extend_schema(request=None, responses={200: RunSerializer, 409: RunSerializer})
    def post(self, request: Request, run_id: str) -> Response:
        run = _run_or_404(request, run_id)
        try:
            run = services.run_cancel(run=run, actor=tenant_of(request).user)
        except services.RunConflict as exc:
            return Response(
                {
                    "error": {
                        "code": "conflict",
                        "message": str(exc),
                        "run": RunSerializer(exc.run).data,
                    }
                },
                status=status.HTTP_409_CONFLICT,
            )
        return Response(RunSerializer(run).data)
