"""GET/PUT /api/v1/budget/: the caller's tenant budget and its use (admins write).

It lives in runs, not budgets: its body counts the tenant's active runs and, for
a tenant without a budget, what its runs spent; an edit starts queued runs.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from budgets.end_user_ledger import end_user_usage
from budgets.selectors import budget_of
from budgets.services import BudgetInputError, budget_as_dict
from controlplane.models import Tenant
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs.budget_burn import budget_activity_for
from runs.selectors import tenant_budget_usage
from runs.services.admission import active_run_count, budget_update_and_admit
from runs.services.lifecycle import END_USER_PATTERN


def _budget_body(tenant: Tenant) -> dict[str, Any]:
    body = budget_as_dict(budget_of(tenant))
    windows = tenant_budget_usage(tenant=tenant)
    body["usage"] = {
        period: {name: values["used"] for name, values in dims.items()}
        for period, dims in windows.items()
    }
    body["usage"]["max_concurrent_runs"] = active_run_count(tenant_id=tenant.pk)
    body["reserved"] = {
        period: {name: values["reserved"] for name, values in dims.items()}
        for period, dims in windows.items()
    }
    return body


class BudgetApi(APIView):
    gate: Gate = {"GET": Action.BUDGET_READ, "PUT": Action.BUDGET_WRITE}

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        return Response(_budget_body(tenant_of(request).tenant))

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def put(self, request: Request) -> Response:
        context = tenant_of(request)
        try:
            budget_update_and_admit(
                tenant=context.tenant,
                actor=context.user,
                data=request.data,
                remote_addr=request.META.get("REMOTE_ADDR"),
            )
        except BudgetInputError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from exc
        return Response(_budget_body(context.tenant))


class BudgetActivityApi(APIView):
    """The budget page's charts and lists: each period's burn-down with its
    forecast, the ledger's latest reservations, the extension requests."""

    gate: Gate = {"GET": Action.BUDGET_READ}

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        return Response(budget_activity_for(tenant=tenant_of(request).tenant))


class EndUserBudgetApi(APIView):
    """One end user's use and reservations in the current windows, beside the
    tenant's per-end-user limits (`limits.end_user` of GET /api/v1/budget/)."""

    gate: Gate = {"GET": Action.BUDGET_READ}

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request, end_user: str) -> Response:
        if not END_USER_PATTERN.fullmatch(end_user):
            raise NotFound("No such end user: not a valid end user id.")
        tenant = tenant_of(request).tenant
        budget = budget_of(tenant)
        limits = budget_as_dict(budget)["limits"]["end_user"]
        usage = (
            end_user_usage(budget=budget, end_user=end_user, now=timezone.now())
            if budget is not None
            else {}
        )
        return Response({"end_user": end_user, "limits": limits, "usage": usage})
