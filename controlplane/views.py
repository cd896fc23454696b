"""Browser pages of the plane itself: login, tenant switch, home."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from controlplane.tenancy import SESSION_TENANT_KEY, tenant_context_for


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """The start page is the runs list (served here too, so "/" needs no hop)."""
    from frontend.views import runs_page

    return runs_page(request)


@login_required
@require_POST
def tenant_switch(request: HttpRequest) -> HttpResponse:
    slug = request.POST.get("tenant", "")
    if tenant_context_for(user=request.user, requested_slug=slug) is None:
        return HttpResponse("You are not a member of that tenant.", status=403)
    request.session[SESSION_TENANT_KEY] = slug
    return redirect(request.POST.get("next") or "home")
