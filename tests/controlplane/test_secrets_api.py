"""/api/v1/secrets/: write-only values, names for every member, writes for admins,
fields named on bad input, other tenants' secrets out of reach, every change audited."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.models import AuditEvent, Secret
from controlplane.secrets import secret_exists, secret_set, secret_value

VALUE = "sk-live-8f2b6c1d9e0a4b3c7d5e6f708192a3b4"
URL = "/api/v1/secrets/"


def test_an_admin_sets_replaces_lists_and_deletes_without_the_value_coming_back(
    tenant: Any, admin_user: Any, api_client_for: Any
) -> None:
    api = api_client_for(admin_user, tenant)
    created = api.put(f"{URL}OPENAI_KEY/", {"value": VALUE}, format="json")
    assert created.status_code == 201, created.content
    assert set(created.json()) == {
        "name",
        "created_by",
        "created_at",
        "updated_by",
        "updated_at",
    }
    assert created.json()["name"] == "OPENAI_KEY"
    assert created.json()["updated_by"] == admin_user.username
    replaced = api.put(f"{URL}OPENAI_KEY/", {"value": VALUE + "2"}, format="json")
    assert replaced.status_code == 200
    posted = api.post(URL, {"name": "MCP_TOKEN", "value": VALUE}, format="json")
    assert posted.status_code == 201
    listed = api.get(URL)
    assert [s["name"] for s in listed.json()] == ["MCP_TOKEN", "OPENAI_KEY"]
    one = api.get(f"{URL}OPENAI_KEY/")
    assert one.json()["name"] == "OPENAI_KEY"
    for response in (created, replaced, posted, listed, one):
        assert VALUE not in response.content.decode()
    assert secret_value(tenant_id=tenant.id, name="OPENAI_KEY") == VALUE + "2"

    assert api.delete(f"{URL}OPENAI_KEY/").status_code == 204
    assert not secret_exists(tenant_id=tenant.id, name="OPENAI_KEY")
    assert api.delete(f"{URL}OPENAI_KEY/").status_code == 404
    audit = api.get("/api/v1/audit/?object_type=secret").json()["results"]
    assert [(e["action"], e["object_id"], e["actor"]) for e in audit] == [
        ("secret.delete", "OPENAI_KEY", admin_user.username),
        ("secret.create", "MCP_TOKEN", admin_user.username),
        ("secret.update", "OPENAI_KEY", admin_user.username),
        ("secret.create", "OPENAI_KEY", admin_user.username),
    ]
    assert all(e["remote_addr"] for e in audit)
    assert VALUE not in str(audit)


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("put", f"{URL}1BAD/", {"value": VALUE}, "name"),
        ("put", f"{URL}has-dash/", {"value": VALUE}, "name"),
        ("put", f"{URL}{'A' * 65}/", {"value": VALUE}, "name"),
        ("post", URL, {"name": "bad name", "value": VALUE}, "name"),
        ("post", URL, {"value": VALUE}, "name"),
        ("put", f"{URL}OK/", {}, "value"),
        ("put", f"{URL}OK/", {"value": ""}, "value"),
        ("put", f"{URL}OK/", {"value": "  "}, "value"),
        ("put", f"{URL}OK/", {"value": None}, "value"),
        ("put", f"{URL}OK/", {"value": {"nested": VALUE}}, "value"),
        ("put", f"{URL}OK/", {"value": "x" * 16_385}, "value"),
        ("put", f"{URL}OK/", {"value": VALUE, "valeu": VALUE}, "valeu"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_with_nothing_written_or_echoed(
    tenant: Any,
    admin_user: Any,
    api_client_for: Any,
    method: str,
    path: str,
    body: dict[str, Any],
    field: str,
) -> None:
    api = api_client_for(admin_user, tenant)
    response = getattr(api, method)(path, body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert field in error["fields"], error
    assert VALUE not in response.content.decode()
    assert not Secret.objects.exists()
    assert not AuditEvent.objects.filter(object_type="secret").exists()


def test_non_admins_read_names_but_may_not_write(
    tenant: Any,
    operator_user: Any,
    viewer_user: Any,
    api_client_for: Any,
) -> None:
    secret_set(tenant=tenant, name="KEPT", value=VALUE, actor=None)
    for user in (operator_user, viewer_user):
        api = api_client_for(user, tenant)
        assert [s["name"] for s in api.get(URL).json()] == ["KEPT"]
        assert api.get(f"{URL}KEPT/").status_code == 200
        refused = [
            api.put(f"{URL}KEPT/", {"value": "changed"}, format="json"),
            api.put(f"{URL}NEW/", {"value": "changed"}, format="json"),
            api.post(URL, {"name": "NEW", "value": "changed"}, format="json"),
            api.delete(f"{URL}KEPT/"),
        ]
        assert [r.status_code for r in refused] == [403] * 4
    assert list(Secret.objects.values_list("name", flat=True)) == ["KEPT"]
    assert secret_value(tenant_id=tenant.id, name="KEPT") == VALUE
    assert AuditEvent.objects.filter(object_type="secret").count() == 1


def test_another_tenants_secret_is_a_404_and_untouched(
    tenant: Any, other_tenant: Any, make_member: Any, api_client_for: Any
) -> None:
    secret_set(tenant=tenant, name="THEIRS", value=VALUE, actor=None)
    outsider = make_member(other_tenant, "olga-outsider", "admin")
    api = api_client_for(outsider, other_tenant)
    assert api.get(URL).json() == []
    assert api.get(f"{URL}THEIRS/").status_code == 404
    assert api.delete(f"{URL}THEIRS/").status_code == 404
    # Setting the name creates the caller's own secret; the other stays as it was.
    assert api.put(f"{URL}THEIRS/", {"value": "mine"}, format="json").status_code == 201
    assert secret_value(tenant_id=tenant.id, name="THEIRS") == VALUE
    assert secret_value(tenant_id=other_tenant.id, name="THEIRS") == "mine"


def test_a_store_without_a_key_answers_503_saying_what_to_set(
    settings: Any, tenant: Any, admin_user: Any, api_client_for: Any
) -> None:
    settings.SECRET_STORE_KEYS = ["not-a-key"]
    api = api_client_for(admin_user, tenant)
    response = api.put(f"{URL}A_KEY/", {"value": VALUE}, format="json")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "secret_store_unavailable"
    assert "CONTROLPLANE_SECRET_KEYS" in error["message"]
    assert "not-a-key" not in error["message"]
    assert not Secret.objects.exists()
    assert api.get(URL).status_code == 200  # names stay readable


def test_a_path_name_no_secret_can_have_is_a_404_to_read_and_a_400_to_set(
    tenant: Any, admin_user: Any, api_client_for: Any
) -> None:
    api = api_client_for(admin_user, tenant)
    for path in (f"{URL}A%00B/", f"{URL}has%20space/", f"{URL}%C3%A9/"):
        assert api.get(path).status_code == 404
        assert api.delete(path).status_code == 404
        refused = api.put(path, {"value": VALUE}, format="json")
        assert refused.status_code == 400
        assert "name" in refused.json()["error"]["fields"]
    assert not Secret.objects.exists()
