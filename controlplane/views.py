"""Browser pages of the plane itself: login, tenant switch, home."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from controlplane.permissions import Action, context_may, declares
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
