"""The Secrets page in real Chromium: an admin sets, replaces and deletes a secret
without its value ever coming back to the page; a viewer reads only the names."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from controlplane.models import AuditEvent
from controlplane.secrets import secret_exists, secret_value

pytestmark = [pytest.mark.browser]

VALUE = "browser-typed-value-9Rk2-heron-44"


def test_admin_sets_and_deletes_a_secret_and_the_value_never_shows(
    tenant: Any, admin_user: Any, viewer_user: Any, open_page: Any
) -> None:
    page = open_page(admin_user, "/secrets/")
    expect(page.get_by_role("link", name="Secrets")).to_have_attribute(
        "aria-current", "page"
    )
    expect(page.locator("#secrets-body")).to_contain_text("No secrets yet.")
    value = page.get_by_label("Value", exact=True)
    expect(value).to_have_attribute("type", "password")

    # The server's refusal shows at the field, and nothing is stored.
    page.get_by_label("Name").fill("1-bad name")
    value.fill(VALUE)
    page.get_by_role("button", name="Save secret").click()
    expect(page.locator("#secret-name-error")).to_contain_text("letters, digits")
    assert not AuditEvent.objects.filter(object_type="secret").exists()

    page.get_by_label("Name").fill("OPENAI_API_KEY")
    page.get_by_role("button", name="Save secret").click()
    expect(page.locator("#secret-saved")).to_have_text("Saved OPENAI_API_KEY.")
    row = page.locator('#secrets-body tr[data-name="OPENAI_API_KEY"]')
    expect(row).to_contain_text(admin_user.username)
    expect(value).to_have_value("")  # the typed value is gone from the form
    assert secret_value(tenant_id=tenant.id, name="OPENAI_API_KEY") == VALUE
    assert VALUE not in page.content()

    # Replace: the row fills in the name; the new value replaces the old.
    row.get_by_role("button", name="Replace the value of OPENAI_API_KEY").click()
    expect(page.get_by_label("Name")).to_have_value("OPENAI_API_KEY")
    expect(value).to_be_focused()
    value.fill(VALUE + "-2")
    page.get_by_role("button", name="Save secret").click()
    expect(value).to_have_value("")
    expect(page.locator("#secrets-body tr")).to_have_count(1)
    assert secret_value(tenant_id=tenant.id, name="OPENAI_API_KEY") == VALUE + "-2"

    # A viewer reads the name and who set it, and gets no controls.
    other = open_page(viewer_user, "/secrets/")
    expect(other.locator("#secrets-body")).to_contain_text("OPENAI_API_KEY")
    expect(other.locator("main")).to_contain_text("Read only")
    expect(other.get_by_role("button", name="Save secret")).to_have_count(0)
    expect(other.get_by_role("button", name="Delete OPENAI_API_KEY")).to_have_count(0)

    delete = row.get_by_role("button", name="Delete OPENAI_API_KEY")
    delete.click()
    expect(delete).to_have_text("Confirm delete")
    assert secret_exists(tenant_id=tenant.id, name="OPENAI_API_KEY")
    delete.click()
    expect(page.locator("#secrets-body")).to_contain_text("No secrets yet.")
    assert not secret_exists(tenant_id=tenant.id, name="OPENAI_API_KEY")
    assert list(
        AuditEvent.objects.filter(object_type="secret")
        .order_by("id")
        .values_list("action", flat=True)
    ) == ["secret.create", "secret.update", "secret.delete"]
