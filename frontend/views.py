"""Server-rendered shells of the browser UI; the ES modules fill them from the API.

Each page resolves the caller's tenant and role here, so a page the caller may not
see is refused by the server (404 for another tenant's run, 403 for the audit log
of a non-admin) and controls a role may not use are never rendered.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from controlplane import selectors as tenancy_selectors
from controlplane.models import Role
from controlplane.permissions import Action, context_may
from controlplane.tenancy import SESSION_TENANT_KEY, TenantContext, tenant_context_for
from runs import selectors as run_selectors
from runs.models import Run


def _context(request: HttpRequest) -> TenantContext | None:
    return tenant_context_for(
        user=request.user, requested_slug=request.session.get(SESSION_TENANT_KEY)
    )


def _page(
    request: HttpRequest,
    template: str,
    context: TenantContext | None,
    page: str,
    extra: dict[str, Any] | None = None,
    status: int = 200,
) -> HttpResponse:
    if context is None or not context_may(context, Action.PAGE_READ):
        return render(request, "frontend/no_tenant.html", {"page": page}, status=403)
    memberships = tenancy_selectors.memberships_of(user=context.user)
    values = {
        "page": page,
        "tenant_context": context,
        "memberships": memberships,
        "role": context.role,
        "can_decide": context_may(context, Action.APPROVAL_DECIDE),
        "can_start": context_may(context, Action.RUN_START),
        "is_admin": context.role == Role.ADMIN,
        **(extra or {}),
    }
    return render(request, template, values, status=status)


@login_required
def runs_page(request: HttpRequest) -> HttpResponse:
    """The runs list: live status, filters and the start-a-run form."""
    return _page(
        request,
        "frontend/runs.html",
        _context(request),
        "runs",
        {"run_statuses": Run.Status.values},
    )


@login_required
def run_page(request: HttpRequest, run_id: str) -> HttpResponse:
    """One run: its trace tree, span details, approvals, budget burn."""
    context = _context(request)
    if context is not None:
        run = run_selectors.run_get_for(tenant=context.tenant, run_id=run_id)
        if run is None:
            raise Http404("No such run in this tenant.")
        return _page(
            request, "frontend/run.html", context, "runs", {"run_id": str(run.id)}
        )
    return _page(request, "frontend/run.html", context, "runs")


@login_required
def approvals_page(request: HttpRequest) -> HttpResponse:
    """Every pending approval of the tenant, oldest first."""
    return _page(request, "frontend/approvals.html", _context(request), "approvals")


@login_required
def budget_page(request: HttpRequest) -> HttpResponse:
    """The tenant's limits and usage; admins edit the limits."""
    return _page(request, "frontend/budget.html", _context(request), "budget")


@login_required
def audit_page(request: HttpRequest) -> HttpResponse:
    """The tenant's audit log (admins only)."""
    context = _context(request)
    if context is not None and not context_may(context, Action.AUDIT_READ):
        return _page(request, "frontend/forbidden.html", context, "audit", status=403)
    return _page(request, "frontend/audit.html", context, "audit")
