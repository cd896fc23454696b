"""The accept page of a one-time password link: the member sets a password,
then logs in. Outside any tenant (the visitor is not signed in), so outside the
role matrix, like the login page; the link's token is the credential.

A used, expired or replaced link gets a page that says so (410), an unknown
one 404; an address that tries too many unknown links is refused for a while
(429), as failed logins are.
"""

from __future__ import annotations

from django.contrib.auth.forms import SetPasswordForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters

from controlplane.authentication import (
    password_link_failure_count,
    password_link_lockout_seconds,
)
from controlplane.password_links import (
    PasswordLinkDead,
    password_link_by_token,
    password_link_problem,
    password_link_redeem,
)

_DEAD = {
    "unknown": "This link is not valid. Check that you copied all of it.",
    "used": "This link has been used already: it works once. Log in with the "
    "password you set, or ask an admin of your tenant for a new link.",
    "expired": "This link has expired. Ask an admin of your tenant for a new one.",
    "revoked": "This link no longer works: a newer one replaced it or your "
    "membership changed. Ask an admin of your tenant for a new one.",
}


def _dead(request: HttpRequest, reason: str) -> HttpResponse:
    return render(
        request,
        "registration/accept_dead.html",
        {"message": _DEAD[reason], "reason": reason},
        status=404 if reason == "unknown" else 410,
    )


@never_cache
@sensitive_post_parameters("new_password1", "new_password2")
def password_link_accept(request: HttpRequest, token: str) -> HttpResponse:
    address = request.META.get("REMOTE_ADDR")
    wait = password_link_lockout_seconds(remote_addr=address)
    if wait is not None:
        response = render(
            request,
            "registration/accept_dead.html",
            {
                "message": "Too many invalid links from this address; try again "
                f"in up to {wait // 60 or 1} minutes.",
                "reason": "locked",
            },
            status=429,
        )
        response["Retry-After"] = str(wait)
        return response
    link = password_link_by_token(token=token)
    problem = password_link_problem(link)
    if problem is not None:
        if problem == "unknown":
            password_link_failure_count(remote_addr=address)
        return _dead(request, problem)
    assert link is not None
    form = SetPasswordForm(
        link.user, request.POST if request.method == "POST" else None
    )
    if request.method == "POST" and form.is_valid():
        try:
            user = password_link_redeem(
                token=token,
                password=form.cleaned_data["new_password1"],
                remote_addr=address,
            )
        except PasswordLinkDead as exc:  # used in another tab meanwhile
            return _dead(request, exc.reason)
        return render(
            request,
            "registration/accept_done.html",
            {"username": user.get_username(), "tenant_name": link.tenant.name},
        )
    return render(
        request,
        "registration/accept.html",
        {"form": form, "link": link, "username": link.user.get_username()},
        status=400 if form.is_bound else 200,
    )
