"""Members and API tokens in real Chromium against a real Daphne: an admin
invites a member, who follows the one-time link, sets a password and logs in;
the admin changes roles (the last admin's is kept, and the page says why) and
revokes a member's token, and the page says who revoked it."""

from __future__ import annotations

import re
from typing import Any

import pytest
import requests
from playwright.sync_api import expect

from controlplane.models import ApiToken, AuditEvent, Membership
from controlplane.services import api_token_issue

pytestmark = [pytest.mark.browser]

NEW_PASSWORD = "brass-kettle-lid-4821"


def test_admin_invites_a_member_who_sets_a_password_and_logs_in(
    tenant: Any,
    other_tenant: Any,
    admin_user: Any,
    make_member: Any,
    open_page: Any,
    chromium: Any,
    daphne: Any,
) -> None:
    page = open_page(admin_user, "/members/")
    refused: list[str] = []
    page.on(
        "console",
        lambda msg: (
            refused.append(msg.text) if "Content Security Policy" in msg.text else None
        ),
    )
    row = page.locator('#members-body tr[data-member="alice-admin"]')
    expect(row).to_contain_text("active")

    page.get_by_label("Email").first.fill("nina@example.com")
    page.locator("#invite-role").select_option("operator")
    page.get_by_role("button", name="Invite").click()
    expect(page.locator("#link-text")).to_contain_text(
        "Send nina@example.com this link to set their password"
    )
    url = page.locator("#link-url").input_value()
    assert re.search(r"/accept/pl_[A-Za-z0-9_-]+/$", url), url
    nina = page.locator('#members-body tr[data-member="nina@example.com"]')
    expect(nina).to_contain_text("invited: link valid until")
    expect(nina.get_by_label("Role of nina@example.com")).to_have_value("operator")

    # The admin makes her a viewer; the row reads the role the server holds.
    nina.get_by_label("Role of nina@example.com").select_option("viewer")
    expect(
        page.locator("#members-body tr[data-member='nina@example.com'] select")
    ).to_have_attribute("data-role", "viewer")
    membership = Membership.objects.get(user__username="nina@example.com")
    assert membership.role == "viewer"

    # The last admin cannot demote herself: the page says why, her role stays.
    row.get_by_label("Role of alice-admin").select_option("viewer")
    expect(page.locator("#members-error")).to_contain_text("last active admin")
    expect(
        page.locator("#members-body tr[data-member='alice-admin'] select")
    ).to_have_attribute("data-role", "admin")
    assert Membership.objects.get(user=admin_user).role == "admin"

    # Nina, in a browser of her own, follows the link.
    context = chromium.new_context(base_url=daphne.url)
    try:
        guest = context.new_page()
        guest.set_default_timeout(20_000)
        guest.goto(url)
        expect(guest.get_by_role("heading", name="Set your password")).to_be_visible()
        expect(guest.locator("#accept-username")).to_have_text("nina@example.com")
        guest.get_by_label("New password", exact=True).fill(NEW_PASSWORD)
        guest.get_by_label("New password again").fill(NEW_PASSWORD)
        guest.get_by_role("button", name="Set password").click()
        expect(
            guest.get_by_role("heading", name="Your password is set")
        ).to_be_visible()
        guest.get_by_role("link", name="Log in").click()
        guest.get_by_label("Username").fill("nina@example.com")
        guest.get_by_label("Password").fill(NEW_PASSWORD)
        guest.get_by_role("button", name="Log in").click()
        guest.wait_for_url("**/")
        expect(guest.locator(".role-badge")).to_have_text("viewer")
        # The link worked once.
        guest.goto(url)
        expect(guest.locator("#dead-message")).to_contain_text("used already")
    finally:
        context.close()

    page.reload()
    expect(
        page.locator('#members-body tr[data-member="nina@example.com"] .member-status')
    ).to_have_text("active")

    # An account that has a password joins without a link, and the page says so.
    sam = make_member(other_tenant, "sam", "viewer")
    sam.email = "sam@example.com"
    sam.save(update_fields=["email"])
    page.get_by_label("Email").first.fill("sam@example.com")
    page.get_by_role("button", name="Invite").click()
    expect(page.locator("#members-notice")).to_contain_text(
        "sam joined as viewer; they log in with the password they have"
    )
    expect(page.locator("#link-box")).to_be_hidden()
    assert refused == []


def test_admin_revokes_a_members_token_and_the_page_says_who(
    tenant: Any, admin_user: Any, operator_user: Any, open_page: Any, daphne: Any
) -> None:
    issued = api_token_issue(tenant=tenant, user=operator_user, name="oscar-laptop")
    me = f"{daphne.url}/api/v1/me/"
    auth = {"Authorization": f"Bearer {issued.secret}"}
    assert requests.get(me, headers=auth, timeout=10).status_code == 200

    page = open_page(admin_user, "/tokens/")
    row = page.locator(f'#tokens-body tr[data-token="{issued.token.id}"]')
    expect(row).to_contain_text("oscar-operator")
    expect(row.locator(".token-status")).to_have_text("active")
    revoke = row.get_by_role("button", name="Revoke oscar-laptop")
    revoke.click()
    expect(revoke).to_have_text("Confirm revoke")
    revoke.click()
    expect(row.locator(".token-status")).to_contain_text("by alice-admin")
    expect(row.get_by_role("button", name="Revoke oscar-laptop")).to_have_count(0)
    assert requests.get(me, headers=auth, timeout=10).status_code == 401

    # A token for a member, made by the admin: its secret is shown once.
    page.get_by_label("Name").fill("oscar-ci")
    page.get_by_label("For").select_option(label="oscar-operator (operator)")
    page.get_by_role("button", name="Create token").click()
    expect(page.locator("#secret-text")).to_contain_text("oscar-ci for oscar-operator")
    secret = page.locator("#secret-value").input_value()
    assert secret.startswith("cp_")
    answer = requests.get(
        me, headers={"Authorization": f"Bearer {secret}"}, timeout=10
    ).json()
    assert answer["username"] == "oscar-operator"
    assert ApiToken.objects.filter(user=operator_user, name="oscar-ci").exists()
    page.reload()
    expect(page.locator("#tokens-body")).to_contain_text("oscar-ci")
    assert secret not in page.content()


def test_admin_deactivates_a_member_whose_token_stops_then_reactivates_them(
    tenant: Any, admin_user: Any, operator_user: Any, open_page: Any, daphne: Any
) -> None:
    issued = api_token_issue(tenant=tenant, user=operator_user, name="oscar-laptop")
    me = f"{daphne.url}/api/v1/me/"
    auth = {"Authorization": f"Bearer {issued.secret}"}
    assert requests.get(me, headers=auth, timeout=10).status_code == 200

    page = open_page(admin_user, "/members/")
    row = page.locator('#members-body tr[data-member="oscar-operator"]')
    expect(row.locator(".member-status")).to_have_text("active")
    row.get_by_role("button", name="Deactivate oscar-operator").click()
    expect(row.locator(".member-status")).to_contain_text("deactivated")
    expect(row).to_have_class("inactive")
    expect(row.get_by_role("button", name="Reactivate oscar-operator")).to_be_visible()
    # The server holds it: his token no longer works here, and the audit says who.
    assert Membership.objects.get(user=operator_user, tenant=tenant).deactivated_at
    assert requests.get(me, headers=auth, timeout=10).status_code in (401, 403)
    event = AuditEvent.objects.get(action="member.deactivate")
    assert event.actor == admin_user

    row.get_by_role("button", name="Reactivate oscar-operator").click()
    expect(row.locator(".member-status")).to_have_text("active")
    assert (
        Membership.objects.get(user=operator_user, tenant=tenant).deactivated_at is None
    )
    assert requests.get(me, headers=auth, timeout=10).status_code == 200
    assert AuditEvent.objects.filter(action="member.reactivate").count() == 1
