"""GET /api/v1/overview/?from=&to=&step=: the dashboard's figures for the
caller's tenant (runs/overview.py computes them)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_input import query_params
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs.overview import OverviewInputError, overview_for, overview_window

# "from" is a Python keyword: the fields are given by name.
OverviewQuerySerializer: type[serializers.Serializer[Any]] = type(
    "OverviewQuerySerializer",
    (serializers.Serializer,),
    {
        "from": serializers.DateTimeField(
            required=False, help_text="ISO 8601; default `to` minus 24 hours"
        ),
        "to": serializers.DateTimeField(
            required=False, help_text="ISO 8601; default now"
        ),
        "step": serializers.ChoiceField(
            choices=["hour", "day"],
            required=False,
            help_text="bucket size; default hour up to 7 days, day beyond",
        ),
    },
)


class OverviewApi(APIView):
    """Runs per bucket by status, p50/p95 duration, approvals, top agents and
    tools by cost and failures, and each period limit's burn with a forecast."""

    gate: Gate = {"GET": Action.RUN_READ}

    @extend_schema(parameters=[OverviewQuerySerializer], responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        query = query_params(request, OverviewQuerySerializer)
        try:
            window = overview_window(
                start=query.get("from"), end=query.get("to"), step=query.get("step")
            )
        except OverviewInputError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from exc
        return Response(overview_for(tenant=tenant_of(request).tenant, window=window))
