"""Browser pages of the plane itself: tenant switch, the not-found page."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from controlplane.permissions import Action, context_may, declares
from controlplane.selectors import memberships_of
from controlplane.tenancy import SESSION_TENANT_KEY, tenant_context_for


@login_required
@require_POST
@declares(Action.TENANT_READ)
def tenant_switch(request: HttpRequest) -> HttpResponse:
    slug = request.POST.get("tenant", "")
    wanted = tenant_context_for(user=request.user, requested_slug=slug)
    if not context_may(wanted, Action.TENANT_READ):
        return HttpResponse("You are not a member of that tenant.", status=403)
    request.session[SESSION_TENANT_KEY] = slug
    return redirect(request.POST.get("next") or "home")


def page_not_found(
    request: HttpRequest, exception: Exception | None = None
) -> HttpResponse:
    """The product's own 404 page (settings.DEBUG off; the pages of a missing
    run or agent render it themselves): the header as on every page, what was
    not found, and the ways back."""
    values: dict[str, Any] = {"request_path": request.path}
    user = request.user
    if isinstance(user, User) and user.is_authenticated:
        context = tenant_context_for(
            user=user, requested_slug=request.session.get(SESSION_TENANT_KEY)
        )
        if context is not None and context_may(context, Action.PAGE_READ):
            values.update(
                tenant_context=context,
                role=context.role,
                memberships=memberships_of(user=user),
            )
    return render(request, "404.html", values, status=404)
