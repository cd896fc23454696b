"""Budget reservations of external agents: /api/v1/budget/reservations/.

An agent running in its own process reserves spend against the tenant's budget
before a model or tool call, then settles it with what it used or releases it
(runs.services.reservations). Reserving, settling and releasing need the role
that may start runs; reading needs budget.read.
"""

from __future__ import annotations

import re
from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from budgets.models import BudgetLedgerEntry
from controlplane.api_input import (
    BoundedPagination,
    reject_unknown_fields,
    remote_addr,
)
from controlplane.api_schema import ErrorSerializer
from controlplane.idempotency import (
    IDEMPOTENCY_KEY_PARAMETER,
    IDEMPOTENCY_KEY_REUSED,
    idempotent,
)
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs.models import Run
from runs.services import reservations as service

_TRACE_ID = re.compile(r"[0-9a-f]{32}")


class ReservationSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    trace_id = serializers.SerializerMethodField()
    kind = serializers.CharField()
    status = serializers.ChoiceField(choices=BudgetLedgerEntry.Status.choices)
    reserved = serializers.SerializerMethodField()
    actual = serializers.SerializerMethodField()
    expires_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()
    settled_at = serializers.DateTimeField(allow_null=True)

    def get_trace_id(self, entry: BudgetLedgerEntry) -> str:
        traces: dict[Any, str] = self.context.get("traces") or {}
        if entry.run_id not in traces:
            found = Run.objects.filter(id=entry.run_id).values_list("trace_id").first()
            traces[entry.run_id] = found[0] if found else ""
        return traces[entry.run_id]

    def get_reserved(self, entry: BudgetLedgerEntry) -> dict[str, str | int]:
        return _amounts(entry.reserved)

    def get_actual(self, entry: BudgetLedgerEntry) -> dict[str, str | int] | None:
        return None if entry.actual is None else _amounts(entry.actual)


def _amounts(stored: dict[str, Any]) -> dict[str, str | int]:
    """The reservable dimensions as stored (cost a decimal string)."""
    return {
        name: stored.get(name, "0" if name == "cost" else 0)
        for name in service.RESERVABLE
    }


class ReservationInputSerializer(serializers.Serializer[Any]):
    trace_id = serializers.CharField(
        help_text="the external run's trace id: 32 lowercase hex digits"
    )
    amounts = serializers.JSONField(
        help_text='what to reserve: {"input_tokens"?, "output_tokens"?, "cost"?}'
    )
    kind = serializers.ChoiceField(
        choices=[BudgetLedgerEntry.Kind.MODEL_CALL, BudgetLedgerEntry.Kind.TOOL_CALL],
        required=False,
        default=BudgetLedgerEntry.Kind.MODEL_CALL,
    )
    ttl_seconds = serializers.IntegerField(
        required=False,
        default=None,
        help_text="released by the control plane this long after (default "
        "BUDGET_RESERVATION_DEFAULT_TTL_SECONDS) unless settled or released",
    )
    agent = serializers.CharField(
        required=False, default="", allow_blank=True, max_length=200,
        help_text="the agent's service name (names the run if this creates it)",
    )  # fmt: skip

    def validate_trace_id(self, value: str) -> str:
        if not _TRACE_ID.fullmatch(value) or value == "0" * 32:
            raise ValidationError("must be 32 lowercase hex digits, not all zero")
        return value


class SettleInputSerializer(serializers.Serializer[Any]):
    actual = serializers.JSONField(
        help_text='what was used: {"input_tokens"?, "output_tokens"?, "cost"?}'
    )


class BudgetExhausted(APIException):
    """409: the reservation would take the tenant over a period limit."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "budget_exhausted"


class ReservationConflictDetailSerializer(serializers.Serializer[Any]):
    code = serializers.CharField(help_text="not_open or trace_not_external")
    message = serializers.CharField()
    reservation = ReservationSerializer(required=False)


class ReservationConflictSerializer(serializers.Serializer[Any]):
    error = ReservationConflictDetailSerializer()


class BudgetExhaustedDetailSerializer(serializers.Serializer[Any]):
    code = serializers.CharField(help_text="budget_exhausted")
    message = serializers.CharField()
    dimension = serializers.CharField(help_text="e.g. tenant_cost_per_day")
    period = serializers.CharField(help_text="day or month")
    name = serializers.CharField(help_text="input_tokens, output_tokens or cost")
    limit = serializers.CharField()
    used_or_reserved = serializers.CharField()
    wanted = serializers.CharField()


class BudgetExhaustedSerializer(serializers.Serializer[Any]):
    error = BudgetExhaustedDetailSerializer()


def _amounts_or_400(data: Any, field: str) -> Any:
    try:
        return service.reservation_amounts(data, field=field)
    except service.ReservationInputError as exc:
        raise ValidationError({exc.field: [str(exc)]}) from None


def _conflict(exc: service.ReservationConflict) -> Response:
    body: dict[str, Any] = {
        "code": "not_open" if exc.entry is not None else "trace_not_external",
        "message": str(exc),
    }
    if exc.entry is not None:
        body["reservation"] = ReservationSerializer(exc.entry).data
    return Response({"error": body}, status=status.HTTP_409_CONFLICT)


def _entry_or_404(request: Request, reservation_id: Any) -> BudgetLedgerEntry:
    tenant = tenant_of(request).tenant
    return get_object_or_404(
        service.reservation_list_for(tenant=tenant), pk=reservation_id
    )


class ReservationListApi(APIView):
    gate: Gate = {"GET": Action.BUDGET_READ, "POST": Action.RUN_START}
    pagination_class = BoundedPagination

    @extend_schema(
        parameters=[
            OpenApiParameter("trace_id", str, description="only this trace's"),
            OpenApiParameter(
                "status",
                str,
                enum=BudgetLedgerEntry.Status.values,
                description="only reservations in this state",
            ),  # fmt: skip
        ],
        responses=ReservationSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        tenant = tenant_of(request).tenant
        found = service.reservation_list_for(tenant=tenant)
        trace_id = request.query_params.get("trace_id")
        if trace_id is not None:
            if not _TRACE_ID.fullmatch(trace_id):
                raise ValidationError({"trace_id": ["must be 32 lowercase hex digits"]})
            runs = Run.objects.filter(tenant=tenant, trace_id=trace_id).values("id")
            found = found.filter(run_id__in=runs)
        wanted_status = request.query_params.get("status")
        if wanted_status is not None:
            if wanted_status not in BudgetLedgerEntry.Status.values:
                raise ValidationError(
                    {"status": [f"one of {', '.join(BudgetLedgerEntry.Status.values)}"]}
                )
            found = found.filter(status=wanted_status)
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(found, request, view=self) or []
        traces = dict(
            Run.objects.filter(id__in={entry.run_id for entry in page}).values_list(
                "id", "trace_id"
            )
        )
        body = ReservationSerializer(page, many=True, context={"traces": traces}).data
        return paginator.get_paginated_response(body)

    @extend_schema(
        request=ReservationInputSerializer,
        parameters=[IDEMPOTENCY_KEY_PARAMETER],
        responses={
            201: ReservationSerializer,
            400: ErrorSerializer,
            409: BudgetExhaustedSerializer,
            422: IDEMPOTENCY_KEY_REUSED,
        },
        description="Reserve spend for the external run of `trace_id` (created "
        "if the trace has not arrived yet). Over a period limit of the tenant's "
        "budget: 409 `budget_exhausted` naming the dimension and period, and "
        "nothing is written.",
    )
    def post(self, request: Request) -> Response:
        return idempotent(
            request,
            tenant=tenant_of(request).tenant,
            operation="budget.reserve",
            respond=lambda: self._reserve(request),
        )

    def _reserve(self, request: Request) -> Response:
        context = tenant_of(request)
        reject_unknown_fields(
            request, {"trace_id", "amounts", "kind", "ttl_seconds", "agent"}
        )
        body = ReservationInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        amounts = _amounts_or_400(data["amounts"], "amounts")
        try:
            entry = service.reservation_create(
                tenant=context.tenant,
                user=context.user,
                trace_id=data["trace_id"],
                amounts=amounts,
                kind=data["kind"],
                ttl_seconds=data["ttl_seconds"],
                agent=data["agent"],
                remote_addr=remote_addr(request),
            )
        except service.ReservationInputError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from None
        except service.ReservationConflict as exc:
            return _conflict(exc)
        except service.ReservationRefused as exc:
            refusal = exc.refusal
            raise BudgetExhausted(
                {
                    "detail": refusal.detail,
                    "dimension": refusal.dimension,
                    "period": refusal.period,
                    "name": refusal.name,
                    "limit": str(refusal.limit),
                    "used_or_reserved": str(refusal.total),
                    "wanted": str(refusal.wanted),
                }
            ) from None
        return Response(
            ReservationSerializer(entry).data, status=status.HTTP_201_CREATED
        )


class ReservationDetailApi(APIView):
    gate: Gate = {"GET": Action.BUDGET_READ}

    @extend_schema(responses=ReservationSerializer)
    def get(self, request: Request, reservation_id: Any) -> Response:
        return Response(
            ReservationSerializer(_entry_or_404(request, reservation_id)).data
        )


class ReservationSettleApi(APIView):
    gate: Gate = {"POST": Action.RUN_START}

    @extend_schema(
        request=SettleInputSerializer,
        parameters=[IDEMPOTENCY_KEY_PARAMETER],
        responses={
            200: ReservationSerializer,
            400: ErrorSerializer,
            409: ReservationConflictSerializer,
            422: IDEMPOTENCY_KEY_REUSED,
        },
        description="Settle an open reservation with what was actually used (more "
        "than reserved is recorded too). Settled, released or expired: 409 with "
        "the reservation as it is.",
    )
    def post(self, request: Request, reservation_id: Any) -> Response:
        entry = _entry_or_404(request, reservation_id)
        return idempotent(
            request,
            tenant=tenant_of(request).tenant,
            operation=f"budget.settle {entry.pk}",
            respond=lambda: self._settle(request, entry),
        )

    def _settle(self, request: Request, entry: BudgetLedgerEntry) -> Response:
        context = tenant_of(request)
        reject_unknown_fields(request, {"actual"})
        body = SettleInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        actual = _amounts_or_400(body.validated_data["actual"], "actual")
        try:
            settled = service.reservation_settle(
                tenant=context.tenant,
                user=context.user,
                reservation_id=entry.pk,
                actual=actual,
                remote_addr=remote_addr(request),
            )
        except service.ReservationConflict as exc:
            return _conflict(exc)
        return Response(ReservationSerializer(settled).data)


class ReservationReleaseApi(APIView):
    gate: Gate = {"POST": Action.RUN_START}

    @extend_schema(
        request=None,
        parameters=[IDEMPOTENCY_KEY_PARAMETER],
        responses={
            200: ReservationSerializer,
            409: ReservationConflictSerializer,
            422: IDEMPOTENCY_KEY_REUSED,
        },
        description="Give an open reservation back unused; 409 once it is not open.",
    )
    def post(self, request: Request, reservation_id: Any) -> Response:
        entry = _entry_or_404(request, reservation_id)
        return idempotent(
            request,
            tenant=tenant_of(request).tenant,
            operation=f"budget.release {entry.pk}",
            respond=lambda: self._release(request, entry),
        )

    def _release(self, request: Request, entry: BudgetLedgerEntry) -> Response:
        context = tenant_of(request)
        try:
            released = service.reservation_release(
                tenant=context.tenant,
                user=context.user,
                reservation_id=entry.pk,
                remote_addr=remote_addr(request),
            )
        except service.ReservationConflict as exc:
            return _conflict(exc)
        return Response(ReservationSerializer(released).data)
