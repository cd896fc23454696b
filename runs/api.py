"""Runs API: start, list, read, cancel and delete runs of the caller's tenant."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.validators import RegexValidator
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_input import BoundedPagination, remote_addr
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
from runs.branch_selectors import run_recovered, run_recovery
from runs.engine.contracts import TOOL_NAME_PATTERN
from runs.engine.evaluator import verdict_of
from runs.engine.stop import StopReason
from runs.models import Run
from runs.services.lifecycle import END_USER_PATTERN
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
    # The end user the run serves ("" for none): its memory, per-user limits.
    end_user = serializers.CharField()
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
    # Complete: ended, its run_finished hooks ran and nothing goes on for it (a
    # recovery branch, a queued follow-up). An ended run reads "finishing" until.
    settled = serializers.BooleanField(source="is_settled")
    settled_at = serializers.DateTimeField(allow_null=True)
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
    # A sub-agent run: the run whose call started it, that call's id, and how
    # deep it is (0: a top-level run); null/""/0 otherwise.
    parent_run = serializers.UUIDField(source="parent_run_id", allow_null=True)
    parent_call_id = serializers.CharField(
        source="parent_tool_call.call_id", allow_null=True, default=None
    )
    depth = serializers.IntegerField()
    # A run whose model call overflowed the window goes on in a recovery branch
    # (runs.services.settle): its id here, and on that branch the run it recovers.
    recovery_run = serializers.SerializerMethodField()
    recovers = serializers.SerializerMethodField()

    def get_recovery_run(self, run: Run) -> str | None:
        return run_recovery(run_id=run.id)

    def get_recovers(self, run: Run) -> str | None:
        return run_recovered(run_id=run.id)


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


class InstantField(serializers.Field[dt.datetime, str, str, Any]):
    """An ISO 8601 time, or a date alone: `from` takes its start of day (UTC),
    `to` the next day's start (the day is included, the range half-open). A time
    without an offset is UTC."""

    default_error_messages = {
        "invalid": "not an ISO 8601 date or time, e.g. 2026-01-31 or "
        "2026-01-31T14:00:00Z"
    }

    def __init__(self, *, day_end: bool = False, **kwargs: Any) -> None:
        self.day_end = day_end
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> dt.datetime:
        # A "+" of an offset arrives as a space when not URL-encoded.
        text = str(data).strip().replace(" ", "+")
        try:
            # parse_datetime takes a date alone as its midnight: dates first.
            day = parse_date(text) if len(text) == 10 else None
            parsed = None if day else parse_datetime(text)
        except ValueError:  # well formed but impossible, e.g. month 13
            self.fail("invalid")
        if day is not None:
            if self.day_end:
                day += dt.timedelta(days=1)
            return dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
        if parsed is None:
            self.fail("invalid")
        return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=dt.UTC)

    def to_representation(self, value: dt.datetime) -> str:
        return value.isoformat()


class RunListQuerySerializer(serializers.Serializer[Any]):
    """The runs list's filters, sort and search (docs/api.md); the page /runs/
    keeps the same names in its URL. An empty value means no filter."""

    status = serializers.ChoiceField(
        choices=Run.Status.values, required=False, allow_blank=True
    )
    agent = serializers.SlugField(max_length=64, required=False, allow_blank=True)
    # The names a tool may have (runs/engine/contracts.py): a name outside them
    # was never run, so it is refused rather than matching nothing.
    tool = serializers.RegexField(
        TOOL_NAME_PATTERN.pattern,
        max_length=64,
        required=False,
        allow_blank=True,
        help_text="runs that made at least one call of this tool (its name as the "
        "model sees it); a run sent over OTLP has no tool calls here",
        error_messages={"invalid": "a tool name is 1 to 64 letters, digits, _ or -"},
    )
    end_user = serializers.RegexField(
        END_USER_PATTERN.pattern,
        max_length=128,
        required=False,
        allow_blank=True,
        help_text="runs serving this end user (the end_user a run was started with)",
        error_messages={
            "invalid": "an end user is 1 to 128 letters, digits or . _ : @ -"
        },
    )
    cost_gt = serializers.DecimalField(
        max_digits=14,
        decimal_places=6,
        min_value=Decimal(0),
        required=False,
        help_text="cost strictly above this amount",
    )
    has_error = serializers.ChoiceField(
        choices=["1", "0", "true", "false"],
        required=False,
        help_text="1: the run failed or one of its spans ended in error; 0: neither",
    )
    waiting = serializers.ChoiceField(
        choices=list(selectors.RUN_WAITING_KINDS),
        required=False,
        help_text="a pending request: approval (a tool call), input (go on after "
        "repeated tool errors?), budget (a budget extension)",
    )
    q = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        help_text="every word in the run's input or final answer (case-insensitive)",
    )
    trace_id = serializers.RegexField(
        TRACE_ID_PATTERN,
        required=False,
        allow_blank=True,
        help_text="the run of this trace (32 hex digits): native or sent over OTLP",
        error_messages={"invalid": "a trace_id is 32 hex digits"},
    )
    sort = serializers.ChoiceField(
        choices=[
            f"{sign}{name}" for name in selectors.RUN_SORT_FIELDS for sign in ("", "-")
        ],
        required=False,
        help_text="a field, descending with a leading '-'; ties: newest first",
    )

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        # `from` is a Python keyword: declared here, not as a class attribute.
        fields = super().get_fields()
        fields["from"] = InstantField(
            required=False, help_text="created at or after (ISO 8601 date or time)"
        )
        fields["to"] = InstantField(
            required=False,
            day_end=True,
            help_text="created before (a date alone: that day included)",
        )
        return fields


class RunListItemSerializer(RunSerializer):
    # Pending approval requests by who they wait on: {"approval": 1, "input": 0,
    # "budget": 0}.
    waiting_on = serializers.SerializerMethodField()

    def get_waiting_on(self, run: Run) -> dict[str, int]:
        waiting: dict[Any, dict[str, int]] = self.context.get("waiting_on", {})
        return waiting.get(run.pk, dict.fromkeys(selectors.RUN_WAITING_KINDS, 0))


def run_list_query_of(request: Request) -> selectors.RunListQuery:
    """The list's query from the request's parameters (400 naming a bad one)."""
    given = {
        name: value
        for name, value in request.query_params.items()
        if str(value).strip() != ""
    }
    checked = RunListQuerySerializer(data=given)
    checked.is_valid(raise_exception=True)
    wanted = checked.validated_data
    has_error = wanted.get("has_error")
    return selectors.RunListQuery(
        status=wanted.get("status") or None,
        agent=wanted.get("agent") or None,
        tool=wanted.get("tool") or None,
        end_user=wanted.get("end_user") or None,
        created_from=wanted.get("from"),
        created_to=wanted.get("to"),
        cost_gt=wanted.get("cost_gt"),
        has_error=None if has_error is None else has_error in ("1", "true"),
        waiting=wanted.get("waiting"),
        text=wanted.get("q", ""),
        trace_id=(wanted.get("trace_id") or "").lower() or None,
        sort=wanted.get("sort") or selectors.RUN_SORT_DEFAULT,
    )


class RunListApi(APIView):
    pagination_class = BoundedPagination

    class RunStartInputSerializer(serializers.Serializer[Any]):
        agent = serializers.SlugField(max_length=64)
        input = serializers.CharField()  # replaced per instance: _input_field()
        limits = serializers.DictField(required=False, default=dict)
        end_user = serializers.CharField(
            required=False,
            default="",
            allow_blank=True,
            max_length=128,
            validators=[
                RegexValidator(
                    END_USER_PATTERN.pattern,
                    message="must be 1 to 128 characters of letters, digits "
                    "and . _ : @ - (e.g. c-8812)",
                )
            ],
            help_text="the end user the run serves (its memory and per-user "
            "budget limits); required when the tenant sets per-user limits",
        )

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.fields["input"] = _input_field()

    gate: Gate = {"GET": Action.RUN_READ, "POST": Action.RUN_START}

    @extend_schema(
        parameters=[RunListQuerySerializer], responses=RunListItemSerializer(many=True)
    )
    def get(self, request: Request) -> Response:
        context = tenant_of(request)
        runs = selectors.run_list_for(
            tenant=context.tenant, query=run_list_query_of(request)
        )
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(runs, request, view=self) or []
        waiting = selectors.run_waiting_on(
            tenant=context.tenant, run_ids=[run.pk for run in page]
        )
        rows = RunListItemSerializer(page, many=True, context={"waiting_on": waiting})
        return paginator.get_paginated_response(rows.data)

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
                end_user=body.validated_data["end_user"],
                started_by=context.user,
            )
        except services.RunInputError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from exc
        found = selectors.run_get_for(tenant=context.tenant, run_id=run.id)
        return Response(RunDetailSerializer(found).data, status=status.HTTP_201_CREATED)


def run_or_404(request: Request, run_id: str) -> Run:
    """The request's tenant's run, or a 404 (also for another tenant's)."""
    run = selectors.run_get_for(tenant=tenant_of(request).tenant, run_id=run_id)
    if run is None:
        raise NotFound("No such run in this tenant.")
    return run


def run_conflict_response(exc: services.RunConflict) -> Response:
    """409 naming why, with the run as it is (RunConflictSerializer)."""
    body = {"code": "conflict", "message": str(exc), "run": RunSerializer(exc.run).data}
    return Response({"error": body}, status=status.HTTP_409_CONFLICT)


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
        return Response(RunDetailSerializer(run_or_404(request, run_id)).data)

    @extend_schema(
        request=None,
        responses={200: RunDeletedSerializer, 409: RunSerializer},
        description="Delete a terminal run with its steps, tool calls, approvals, "
        "spans, payloads only it used, and events (admins; audited as "
        "`run.delete`). A run that has not ended is 409: cancel it first. Budget "
        "ledger rows are billing records and are kept.",
    )
    def delete(self, request: Request, run_id: str) -> Response:
        run = run_or_404(request, run_id)
        try:
            deleted = run_delete(
                run=run,
                actor=tenant_of(request).user,
                remote_addr=remote_addr(request),
            )
        except Run.DoesNotExist:
            raise NotFound("No such run in this tenant.") from None
        except services.RunConflict as exc:
            return run_conflict_response(exc)
        return Response({"id": str(run.id), "deleted": deleted.as_dict()})


class RunCancelApi(APIView):
    gate: Gate = {"POST": Action.RUN_CANCEL}

    @extend_schema(
        request=None, responses={200: RunSerializer, 409: RunConflictSerializer}
    )
    def post(self, request: Request, run_id: str) -> Response:
        run = run_or_404(request, run_id)
        try:
            run = services.run_cancel(run=run, actor=tenant_of(request).user)
        except services.RunConflict as exc:
            return run_conflict_response(exc)
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
