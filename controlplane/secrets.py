"""The per-tenant secret store: values encrypted at rest, written by admins,
read in the clear only by the code that hands one to the client that needs it.

- `secret_value` / `secret_exists`: the reads other apps call (a model client's
  key, an MCP server's auth header, a credential the egress proxy injects);
  `SecretMissing` names the secret a caller asked for and could not have.
- `secret_set` / `secret_delete`: the audited writes behind the API; the audit
  event records the name and who, never the value.
- `secret_keys_rotate`: re-encrypts every secret with the first configured key
  (`manage.py rotate_secret_keys`).

Each value is sealed together with its tenant and name, so a ciphertext copied to
another row (another tenant's, another name) does not open there. Every value
this process handles is also handed to the redaction layer, which scrubs it from
whatever text is logged, traced or serialized afterwards (controlplane.redaction).
"""

from __future__ import annotations

import json
import re
from typing import Any

from cryptography.fernet import InvalidToken
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.views.decorators.debug import sensitive_variables

from controlplane import secret_keys
from controlplane.models import Secret, Tenant
from controlplane.redaction import secret_value_known
from controlplane.secret_keys import SecretKeysUnavailable
from controlplane.services import audit_record

# \Z, not $: "$" also matches before a trailing newline.
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
MAX_VALUE_CHARS = 16_384

__all__ = [
    "MAX_VALUE_CHARS",
    "NAME_PATTERN",
    "SecretInputError",
    "SecretKeysUnavailable",
    "SecretMissing",
    "SecretUnreadable",
    "secret_delete",
    "secret_exists",
    "secret_keys_rotate",
    "secret_name_problem",
    "secret_set",
    "secret_value",
]


class SecretMissing(LookupError):
    """The tenant has no readable secret of this name; the message names it."""

    def __init__(self, name: str, message: str | None = None) -> None:
        self.name = name
        super().__init__(message or f"secret {name!r} is not set in this tenant")

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (a task's failure, a process boundary) with its name and message.
        return (type(self), (self.name, str(self)))


class SecretUnreadable(SecretMissing):
    """The secret is stored but cannot be read: no configured key opens it (a key
    was dropped before `rotate_secret_keys`), it was sealed for another row, or
    the store has no usable key. A caller that catches SecretMissing gets these
    too: either way the value is not available, and the message says why."""


class SecretInputError(ValueError):
    """A write refused for one field; the message says what to fix (never the value)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


def secret_name_problem(name: Any) -> str | None:
    """Why `name` cannot name a secret, or None."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        return (
            "A secret name is 1-64 letters, digits and underscores, not starting "
            "with a digit (like OPENAI_API_KEY)."
        )
    return None


def _value_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return "The value must be a string."
    if not value.strip():
        return "The value must not be empty."
    if len(value) > MAX_VALUE_CHARS:
        return f"The value is longer than {MAX_VALUE_CHARS} characters."
    if "\x00" in value:
        return "The value must not contain NUL characters."
    return None


@sensitive_variables("value", "payload")
def _seal(*, tenant_id: Any, name: str, value: str) -> tuple[str, str]:
    """(ciphertext, key_id) of `value` bound to its tenant and name."""
    keys = secret_keys.active_keys()
    payload = json.dumps({"tenant": str(tenant_id), "name": name, "value": value})
    token = secret_keys.fernet().encrypt(payload.encode())
    return token.decode(), secret_keys.key_id(keys[0])


@sensitive_variables("payload")
def _open(secret: Secret) -> str:
    try:
        payload = json.loads(secret_keys.fernet().decrypt(secret.ciphertext.encode()))
    except SecretKeysUnavailable as exc:
        raise SecretUnreadable(
            secret.name, f"secret {secret.name!r} cannot be read: {exc}"
        ) from None
    except InvalidToken:
        raise SecretUnreadable(
            secret.name,
            f"secret {secret.name!r} cannot be decrypted with the keys in "
            "CONTROLPLANE_SECRET_KEYS (was its key removed before "
            "`manage.py rotate_secret_keys` ran?); set it again",
        ) from None
    if payload.get("tenant") != str(secret.tenant_id) or payload.get("name") != (
        secret.name
    ):
        raise SecretUnreadable(
            secret.name,
            f"secret {secret.name!r} was sealed for another tenant or name; set it "
            "again",
        )
    value: str = payload["value"]
    secret_value_known(value)
    return value


def secret_value(*, tenant_id: Any, name: str) -> str:
    """The value of the tenant's secret `name`, in the clear: hand it to the one
    client that needs it, and to nothing that records (a prompt, a span, an
    event, a log line, the sandbox). SecretMissing names what is missing."""
    # A name no secret can have is not looked up (a NUL in it would be a
    # database error on PostgreSQL, not a missing secret).
    secret = (
        None
        if secret_name_problem(name)
        else Secret.objects.filter(tenant_id=tenant_id, name=name).first()
    )
    if secret is None:
        raise SecretMissing(str(name))
    return _open(secret)


def secret_exists(*, tenant_id: Any, name: str) -> bool:
    """Whether the tenant has a secret `name` (to validate a reference to it)."""
    if secret_name_problem(name):
        return False
    return Secret.objects.filter(tenant_id=tenant_id, name=name).exists()


@sensitive_variables("value")
def secret_set(
    *,
    tenant: Tenant,
    name: str,
    value: str,
    actor: User | None,
    remote_addr: str | None = None,
) -> Secret:
    """Create or replace the tenant's secret `name`. SecretInputError names the
    field to fix; SecretKeysUnavailable if the store has no usable key (nothing
    is written either way)."""
    problem = secret_name_problem(name)
    if problem:
        raise SecretInputError("name", problem)
    problem = _value_problem(value)
    if problem:
        raise SecretInputError("value", problem)
    secret_value_known(value)
    ciphertext, key_id = _seal(tenant_id=tenant.pk, name=name, value=value)
    with transaction.atomic():
        secret = (
            Secret.objects.select_for_update().filter(tenant=tenant, name=name).first()
        )
        created = secret is None
        if secret is None:
            try:
                with transaction.atomic():
                    secret = Secret.objects.create(
                        tenant=tenant,
                        name=name,
                        ciphertext=ciphertext,
                        key_id=key_id,
                        created_by=actor,
                        updated_by=actor,
                    )
            except IntegrityError:
                # Created by a concurrent request since we looked: replace it.
                secret = Secret.objects.select_for_update().get(
                    tenant=tenant, name=name
                )
                created = False
        if not created:
            secret.ciphertext = ciphertext
            secret.key_id = key_id
            secret.updated_by = actor
            secret.save(
                update_fields=["ciphertext", "key_id", "updated_by", "updated_at"]
            )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="secret.create" if created else "secret.update",
            object_type="secret",
            object_id=name,
            after={"name": name},
            remote_addr=remote_addr,
        )
    return secret


def secret_delete(
    *, tenant: Tenant, name: str, actor: User | None, remote_addr: str | None = None
) -> bool:
    """Delete the tenant's secret `name`; False if it had none."""
    if secret_name_problem(name):
        return False
    with transaction.atomic():
        deleted, _ = Secret.objects.filter(tenant=tenant, name=name).delete()
        if deleted:
            audit_record(
                tenant=tenant,
                actor=actor,
                action="secret.delete",
                object_type="secret",
                object_id=name,
                before={"name": name},
                remote_addr=remote_addr,
            )
    return bool(deleted)


def secret_keys_rotate() -> tuple[int, list[Secret]]:
    """Re-encrypt every secret not yet under the first configured key with it.

    Returns how many were re-encrypted, and the secrets no configured key opens
    (their old key must stay until they are set again). Each row is rewritten
    in its own short transaction, so the command can run beside the service
    and be run again after an interruption.
    """
    fernet = secret_keys.fernet()
    current = secret_keys.key_id(secret_keys.active_keys()[0])
    rotated = 0
    unreadable: list[Secret] = []
    stale = Secret.objects.exclude(key_id=current).values_list("id", flat=True)
    for secret_id in list(stale):
        with transaction.atomic():
            secret = (
                Secret.objects.select_for_update()
                .select_related("tenant")
                .filter(id=secret_id)
                .first()
            )
            if secret is None or secret.key_id == current:
                continue  # deleted or rotated meanwhile
            try:
                token = fernet.rotate(secret.ciphertext.encode())
            except InvalidToken:
                unreadable.append(secret)
                continue
            # update(), not save(): "when was it set" stays the person's change.
            Secret.objects.filter(id=secret.id).update(
                ciphertext=token.decode(), key_id=current
            )
            rotated += 1
    if rotated:
        audit_record(
            tenant=None,
            actor=None,
            action="secret.rotate_keys",
            object_type="secret",
            object_id="*",
            after={"rotated": rotated, "key_id": current},
        )
    return rotated, unreadable
