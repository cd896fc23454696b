"""The per-tenant secret store: encrypted at rest, bound to its tenant and name,
audited without its value, rotated to a new key, refused without a usable key."""

from __future__ import annotations

import io
import logging
import pickle
import stat
import threading
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db import connection

from controlplane import checks, secret_keys
from controlplane.models import AuditEvent, Secret
from controlplane.redaction import REDACTED, redact_text
from controlplane.secrets import (
    SecretInputError,
    SecretKeysUnavailable,
    SecretMissing,
    SecretUnreadable,
    secret_delete,
    secret_exists,
    secret_keys_rotate,
    secret_set,
    secret_value,
)

VALUE = "sk-test-3c5d0b7e9a1f4e2db8c6a0f1e2d3c4b5"


@pytest.fixture
def key_a(settings: Any) -> str:
    key = Fernet.generate_key().decode()
    settings.SECRET_STORE_KEYS = [key]
    return key


def test_a_value_is_stored_encrypted_and_read_back(tenant, admin_user, key_a):
    secret = secret_set(tenant=tenant, name="OPENAI_KEY", value=VALUE, actor=admin_user)
    row = Secret.objects.get(id=secret.id)
    assert VALUE not in row.ciphertext
    assert row.key_id == secret_keys.key_id(key_a)
    assert (row.created_by, row.updated_by) == (admin_user, admin_user)
    assert secret_value(tenant_id=tenant.id, name="OPENAI_KEY") == VALUE
    assert secret_exists(tenant_id=tenant.id, name="OPENAI_KEY")


def test_a_missing_secret_names_itself(tenant):
    with pytest.raises(SecretMissing) as raised:
        secret_value(tenant_id=tenant.id, name="OPENAI_KEY")
    assert isinstance(raised.value, LookupError)
    assert str(raised.value) == "secret 'OPENAI_KEY' is not set in this tenant"
    assert raised.value.name == "OPENAI_KEY"
    assert not secret_exists(tenant_id=tenant.id, name="OPENAI_KEY")


def test_a_name_no_secret_can_have_is_missing_without_a_query(
    tenant, django_assert_num_queries
):
    with django_assert_num_queries(0):
        for name in ("A\x00B", "has space", 7):
            with pytest.raises(SecretMissing):
                secret_value(tenant_id=tenant.id, name=name)
            assert not secret_exists(tenant_id=tenant.id, name=name)
            assert not secret_delete(tenant=tenant, name=name, actor=None)


def test_secret_missing_survives_pickling_with_its_name_and_message():
    copy = pickle.loads(pickle.dumps(SecretMissing("OPENAI_KEY")))
    assert (copy.name, str(copy)) == (
        "OPENAI_KEY",
        "secret 'OPENAI_KEY' is not set in this tenant",
    )
    unreadable = pickle.loads(pickle.dumps(SecretUnreadable("K", "cannot be read")))
    assert (type(unreadable), unreadable.name, str(unreadable)) == (
        SecretUnreadable,
        "K",
        "cannot be read",
    )


def test_another_tenant_cannot_read_it(tenant, other_tenant, admin_user):
    secret_set(tenant=tenant, name="OPENAI_KEY", value=VALUE, actor=admin_user)
    with pytest.raises(SecretMissing):
        secret_value(tenant_id=other_tenant.id, name="OPENAI_KEY")
    assert not secret_exists(tenant_id=other_tenant.id, name="OPENAI_KEY")


def test_a_ciphertext_copied_to_another_row_does_not_open(
    tenant, other_tenant, admin_user
):
    mine = secret_set(tenant=tenant, name="OPENAI_KEY", value=VALUE, actor=admin_user)
    theirs = secret_set(
        tenant=other_tenant, name="OPENAI_KEY", value="their own value", actor=None
    )
    Secret.objects.filter(id=theirs.id).update(ciphertext=mine.ciphertext)
    with pytest.raises(SecretUnreadable, match="sealed for another tenant or name"):
        secret_value(tenant_id=other_tenant.id, name="OPENAI_KEY")


def test_set_replaces_and_every_change_is_audited_without_the_value(
    tenant, admin_user, make_member
):
    other_admin = make_member(tenant, "bob-admin", "admin")
    secret_set(tenant=tenant, name="API_KEY", value=VALUE, actor=admin_user)
    secret_set(tenant=tenant, name="API_KEY", value=VALUE + "-new", actor=other_admin)
    assert Secret.objects.filter(tenant=tenant).count() == 1
    assert secret_value(tenant_id=tenant.id, name="API_KEY") == VALUE + "-new"
    row = Secret.objects.get(tenant=tenant, name="API_KEY")
    assert (row.created_by, row.updated_by) == (admin_user, other_admin)
    assert secret_delete(tenant=tenant, name="API_KEY", actor=admin_user) is True
    assert secret_delete(tenant=tenant, name="API_KEY", actor=admin_user) is False
    events = list(AuditEvent.objects.filter(tenant=tenant).order_by("id"))
    assert [(e.action, e.object_type, e.object_id, e.actor) for e in events] == [
        ("secret.create", "secret", "API_KEY", admin_user),
        ("secret.update", "secret", "API_KEY", other_admin),
        ("secret.delete", "secret", "API_KEY", admin_user),
    ]
    for event in events:
        assert VALUE not in repr((event.before, event.after))


@pytest.mark.parametrize(
    ("name", "value", "field"),
    [
        ("1ST", VALUE, "name"),
        ("has-dash", VALUE, "name"),
        ("", VALUE, "name"),
        ("A" * 65, VALUE, "name"),
        ("TRAILING\n", VALUE, "name"),
        ("OK", "", "value"),
        ("OK", "   ", "value"),
        ("OK", "x" * 16_385, "value"),
        ("OK", "a\x00b", "value"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(
    tenant, admin_user, name, value, field
):
    with pytest.raises(SecretInputError) as raised:
        secret_set(tenant=tenant, name=name, value=value, actor=admin_user)
    assert raised.value.field == field
    assert not Secret.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="secret.").exists()


def test_rotation_re_encrypts_so_the_old_key_can_go(settings, tenant, admin_user):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.SECRET_STORE_KEYS = [old]
    secret_set(tenant=tenant, name="A_KEY", value=VALUE, actor=admin_user)
    secret_set(tenant=tenant, name="B_KEY", value=VALUE + "-b", actor=admin_user)

    settings.SECRET_STORE_KEYS = [new, old]
    out = io.StringIO()
    call_command("rotate_secret_keys", stdout=out)
    assert "Re-encrypted 2 secret(s)" in out.getvalue()
    assert set(Secret.objects.values_list("key_id", flat=True)) == {
        secret_keys.key_id(new)
    }
    assert secret_keys_rotate() == (0, [])  # a second run has nothing to do

    settings.SECRET_STORE_KEYS = [new]
    assert secret_value(tenant_id=tenant.id, name="A_KEY") == VALUE
    assert secret_value(tenant_id=tenant.id, name="B_KEY") == VALUE + "-b"
    assert AuditEvent.objects.filter(action="secret.rotate_keys").count() == 1


def test_dropping_a_key_before_rotating_is_reported(settings, tenant, admin_user):
    lost = Fernet.generate_key().decode()
    settings.SECRET_STORE_KEYS = [lost]
    secret_set(tenant=tenant, name="LOST_KEY", value=VALUE, actor=admin_user)
    settings.SECRET_STORE_KEYS = [Fernet.generate_key().decode()]
    with pytest.raises(SecretUnreadable, match="rotate_secret_keys"):
        secret_value(tenant_id=tenant.id, name="LOST_KEY")
    with pytest.raises(CommandError, match="kettlecraft/LOST_KEY"):
        call_command("rotate_secret_keys", stdout=io.StringIO())


def test_no_key_with_debug_off_refuses_and_the_check_says_what_to_set(
    settings, tenant, admin_user
):
    settings.SECRET_STORE_KEYS = []
    settings.DEBUG = False
    with pytest.raises(SecretKeysUnavailable, match="CONTROLPLANE_SECRET_KEYS"):
        secret_set(tenant=tenant, name="A_KEY", value=VALUE, actor=admin_user)
    assert not Secret.objects.exists()
    (error,) = checks.secret_store_keys(None)
    assert error.id == "controlplane.E010"
    assert "CONTROLPLANE_SECRET_KEYS" in error.hint


def test_an_invalid_key_is_named_by_position_never_shown(settings, key_a):
    settings.SECRET_STORE_KEYS = [key_a, "not-a-fernet-key-at-all"]
    (error,) = checks.secret_store_keys(None)
    assert error.id == "controlplane.E010"
    assert "key 2 of 2" in error.msg
    assert "not-a-fernet-key" not in error.msg and key_a not in error.msg
    with pytest.raises(SecretKeysUnavailable):
        secret_keys.fernet()


def test_a_readable_secret_fails_clearly_once_the_keys_are_broken(
    settings, tenant, admin_user, key_a
):
    secret_set(tenant=tenant, name="A_KEY", value=VALUE, actor=admin_user)
    settings.SECRET_STORE_KEYS = ["broken"]
    with pytest.raises(SecretMissing, match="'A_KEY' cannot be read: key 1 of 1"):
        secret_value(tenant_id=tenant.id, name="A_KEY")


def test_debug_without_keys_generates_one_private_key_file_once(
    settings, tmp_path, tenant, admin_user, caplog
):
    path = tmp_path / "run" / "secret-store.key"
    settings.SECRET_STORE_KEYS = []
    settings.DEBUG = True
    settings.SECRET_STORE_DEV_KEY_FILE = path
    assert checks.secret_store_keys(None) == []
    with caplog.at_level(logging.WARNING, logger="controlplane.secret_keys"):
        secret_set(tenant=tenant, name="A_KEY", value=VALUE, actor=admin_user)
    assert str(path) in caplog.text and "CONTROLPLANE_SECRET_KEYS" in caplog.text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = path.read_text().strip()
    Fernet(key)  # a valid key
    assert secret_value(tenant_id=tenant.id, name="A_KEY") == VALUE
    assert path.read_text().strip() == key  # not generated again
    assert [p.name for p in path.parent.iterdir()] == [path.name]

    path.chmod(0o644)
    (warning,) = checks.secret_store_keys(None)
    assert warning.id == "controlplane.W010"
    path.write_text("garbage\n")
    (error,) = [m for m in checks.secret_store_keys(None) if m.id.endswith("E010")]
    assert "does not hold a Fernet key" in error.msg


def test_a_handled_value_is_scrubbed_from_any_later_text(tenant, admin_user):
    value = "plain-words-no-pattern-matches-this-7f3a"
    assert redact_text(f"calling with {value}") == f"calling with {value}"
    secret_set(tenant=tenant, name="PLAIN", value=value, actor=admin_user)
    assert redact_text(f"calling with {value}") == f"calling with {REDACTED}"
    assert redact_text('{"x": "' + value + '"}') == '{"x": "' + REDACTED + '"}'


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_sets_of_one_name_make_one_secret(tenant, admin_user):
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def set_it(n: int) -> None:
        try:
            barrier.wait(timeout=10)
            secret_set(tenant=tenant, name="RACED", value=f"{VALUE}-{n}", actor=None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=set_it, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert Secret.objects.filter(tenant=tenant, name="RACED").count() == 1
    assert secret_value(tenant_id=tenant.id, name="RACED").startswith(VALUE)
    actions = sorted(
        AuditEvent.objects.filter(object_id="RACED").values_list("action", flat=True)
    )
    assert actions == ["secret.create"] + ["secret.update"] * 3
