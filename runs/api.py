"""Runs API: start, list, read, cancel and delete runs of the caller's tenant."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.core.validators import RegexValidator
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_input import BoundedPagination, query_params, remote_addr
from controlplane.api_schema import ErrorDetailSerializer
from controlplane.idempotency import (
    IDEMPOTENCY_KEY_PARAMETER,
    IDEMPOTENCY_KEY_REUSED,
    idempotent,
)
from controlplane.permissions import Action, Gate
from controlplane.redaction import RedactedCharField, RedactedJSONField
from controlplane.tenancy import tenant_of
from runs import selectors, services
from runs.engine.evaluator import verdict_of
from runs.engine.stop import StopReason
from runs.models import Run
from runs.services.retention import run_delete
from runs.services.spend import run_usage_against_caps
from runs.stats import run_stats_for

# A W3C / OpenTelemetry trace id (the runs list's and GET /traces/<id>/'s).
TRACE_ID_PATTERN = r"^[0-9a-fA-F]{32}$"


class ToolCallSerializer(serializers.Serializer[Any]):
    call_id = serializers.CharField()
    tool_name = serializers.CharField()
    # The row keeps what the tool executes with; a reader sees it redacted.
    args = RedactedJSONField()
    status = serializers.CharField()
    effect = serializers.CharField()
    attempts = serializers.IntegerField()
    result = RedactedJSONField()
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
    action = RedactedJSONField()
    tool_calls = ToolCallSerializer(many=True)


class RunSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    agent = serializers.CharField(source="agent.slug")
    # The agent version the run pinned at its start (null: a run sent over OTLP).
    agent_version = serializers.IntegerField(
        source="agent_version.number", allow_null=True
    )
    status = serializers.CharField()
    stop_reason = serializers.CharField(
        help_text="empty while the run goes on; else one of "
        + ", ".join(StopReason)
        + ", the tenant budget dimension that stopped it "
        "(tenant_<dimension>_per_<day|month>), or external (a run sent over OTLP)"
    )
    stop_detail = RedactedCharField()
    input = RedactedCharField()
    final_answer = RedactedCharField()
    evaluation = RedactedJSONField()
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
    # A finished run's outcome in words: {"verdict": passed | failed | unverified
    # | none, "reason": ...}; null while the run goes on.
    verdict = serializers.SerializerMethodField()

    def get_verdict(self, run: Run) -> dict[str, str] | None:
        if not run.is_terminal:
            return None
        verdict, reason = verdict_of(run.status, run.evaluation)
        return {"verdict": verdict, "reason": reason}

    def get_budget(self, run: Run) -> dict[str, dict[str, Any]]:
        """Use against cap per dimension: {"steps": {"used": 3, "cap": 50}, ...}."""
        return run_usage_against_caps(run)


class RunDetailSerializer(RunSerializer):
    step_rows = StepSerializer(many=True, source="step_rows.all")


class RunConflictDetailSerializer(ErrorDetailSerializer):
    run = RunSerializer()


class RunConflictSerializer(serializers.Serializer[Any]):
    """409: the run is not in a state that allows it; `run` is as it is now."""

    error = RunConflictDetailSerializer()


def _input_field() -> serializers.CharField:
    # The schema says what run_start refuses: blank input (pattern) and more than
    # RUN_MAX_INPUT_CHARS characters (read when the serializer is built).
    return serializers.CharField(
        trim_whitespace=False,
        max_length=settings.RUN_MAX_INPUT_CHARS,
        validators=[RegexValidator(r"\S", message="the input is blank")],
    )


class RunListApi(APIView):
    pagination_class = BoundedPagination

    class RunListQuerySerializer(serializers.Serializer[Any]):
        # An empty value means no filter, as it always has.
        status = serializers.ChoiceField(
            choices=Run.Status.values, required=False, allow_blank=True
        )
        agent = serializers.SlugField(max_length=64, required=False, allow_blank=True)
        trace_id = serializers.RegexField(
            TRACE_ID_PATTERN,
            required=False,
            allow_blank=True,
            help_text="the run of this trace (32 hex digits): native or sent over OTLP",
            error_messages={"invalid": "a trace_id is 32 hex digits"},
        )

    class RunStartInputSerializer(serializers.Serializer[Any]):
        agent = serializers.SlugField(max_length=64)
        input = serializers.CharField()  # replaced per instance: _input_field()
        limits = serializers.DictField(required=False, default=dict)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.fields["input"] = _input_field()

    gate: Gate = {"GET": Action.RUN_READ, "POST": Action.RUN_START}

    @extend_schema(
        parameters=[RunListQuerySerializer], responses=RunSerializer(many=True)
    )
    def get(self, request: Request) -> Response:
        context = tenant_of(request)
        wanted = query_params(request, self.RunListQuerySerializer)
        runs = selectors.run_list_for(
            tenant=context.tenant,
            status=wanted.get("status"),
            agent=wanted.get("agent"),
            trace_id=(wanted.get("trace_id") or "").lower() or None,
        )
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(runs, request, view=self)
        return paginator.get_paginated_response(RunSerializer(page, many=True).data)

    @extend_schema(
        request=RunStartInputSerializer,
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
        body = self.RunStartInputSerializer(data=request.data)
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


class DeletedSerializer(serializers.Serializer[Any]):
    """Rows deleted with the run, by kind."""

    runs = serializers.IntegerField()
    steps = serializers.IntegerField()
    tool_calls = serializers.IntegerField()
    approvals = serializers.IntegerField()
    approval_decisions = serializers.IntegerField()
    spans = serializers.IntegerField()
    span_payloads = serializers.IntegerField()
    events = serializers.IntegerField()


class RunDeletedSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    deleted = DeletedSerializer()


class RunDetailApi(APIView):
    # Reading is run.read; DELETE is run.delete (admins, docs/data.md).
    gate: Gate = {"GET": Action.RUN_READ, "DELETE": Action.RUN_DELETE}

    @extend_schema(responses=RunDetailSerializer)
    def get(self, request: Request, run_id: str) -> Response:
        return Response(RunDetailSerializer(_run_or_404(request, run_id)).data)

    @extend_schema(
        request=None,
        responses={200: RunDeletedSerializer, 409: RunSerializer},
        description="Delete a terminal run with its steps, tool calls, approvals, "
        "spans, payloads only it used, and events (admins; audited as "
        "`run.delete`). A run that has not ended is 409: cancel it first. Budget "
        "ledger rows are billing records and are kept.",
    )
    def delete(self, request: Request, run_id: str) -> Response:
        run = _run_or_404(request, run_id)
        try:
            deleted = run_delete(
                run=run,
                actor=tenant_of(request).user,
                remote_addr=remote_addr(request),
            )
        except Run.DoesNotExist:
            raise NotFound("No such run in this tenant.") from None
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
        return Response({"id": str(run.id), "deleted": deleted.as_dict()})


class RunCancelApi(APIView):
    gate: Gate = {"POST": Action.RUN_CANCEL}

    @extend_schema(
        request=None, responses={200: RunSerializer, 409: RunConflictSerializer}
    )
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


class StatsApi(APIView):
    """The dashboard's aggregates of this tenant's runs created since `since`."""

    gate: Gate = {"GET": Action.RUN_READ}

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "since", str, description="ISO 8601 time; default 30 days ago"
            )
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request: Request) -> Response:
        raw = request.query_params.get("since")
        if raw is None:
            since = timezone.now() - dt.timedelta(days=30)
        else:
            try:  # a "+" of an offset arrives as a space when not URL-encoded
                parsed = parse_datetime(raw.strip().replace(" ", "+"))
            except ValueError:  # well formed but impossible, e.g. month 13
                parsed = None
            if parsed is None:
                raise ValidationError(
                    {"since": ["not an ISO 8601 time, e.g. 2026-01-31T00:00:00Z"]}
                )
            since = (
                parsed
                if timezone.is_aware(parsed)
                else timezone.make_aware(parsed, dt.UTC)
            )
        return Response(run_stats_for(tenant=tenant_of(request).tenant, since=since))
