"""Tenants, who belongs to them with which role, API tokens and the audit log."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models


class Tenant(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    # Terminal runs older than this many days are deleted by beat with their
    # steps, tool calls, approvals, spans, payloads and events (docs/data.md);
    # null: the deployment's DATA_RETENTION_DAYS (empty there: keep forever).
    retention_days = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    ADMIN = "admin"
    OPERATOR = "operator"
    VIEWER = "viewer"


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set while an admin has deactivated the member: they keep their row (and
    # their tokens, refused meanwhile) but belong to the tenant for nothing.
    deactivated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "tenant"], name="one_role_per_tenant"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role}"


class ApiToken(models.Model):
    """A bearer token; only its SHA-256 is stored, the secret is shown once."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="tokens")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, db_index=True)
    token_sha256 = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user} in {self.tenant})"


class PasswordLink(models.Model):
    """A one-time link that lets a member set their password (an invitation).

    Only the SHA-256 of its token is stored; the token is shown once, to the
    admin who made the link. It dies when used, when it expires, when a newer
    link for the same member replaces it, or when the member is no longer an
    active member of the tenant.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="password_links"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    token_sha256 = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"password link for {self.user} in {self.tenant}"


class AuditEvent(models.Model):
    """Who did what to which object, with the state before and after."""

    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="audit_events", null=True
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    action = models.CharField(max_length=64)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.action} {self.object_type}:{self.object_id}"


class IdempotencyKey(models.Model):
    """A client's `Idempotency-Key` on a write, and the answer its first request got.

    Stored in the transaction of the write itself, so the key exists exactly
    when the work was committed; a retry with the key is answered from here.
    """

    # The unique index below starts with the tenant: no index of its own.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    key = models.CharField(max_length=255)
    operation = models.CharField(max_length=128)  # "run.start", "approval.decide …"
    request_sha256 = models.CharField(max_length=64)
    response_status = models.PositiveSmallIntegerField(null=True)
    response_body = models.JSONField(null=True, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "key"], name="idempotency_key_unique_per_tenant"
            )
        ]

    def __str__(self) -> str:
        return f"{self.operation} {self.key!r}"


class Secret(models.Model):
    """A tenant's named secret, encrypted at rest (controlplane.secrets).

    The value is never stored in the clear and never read back through the API:
    only the process that hands it to the model client or the MCP connection
    that needs it decrypts it.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # The unique index below starts with the tenant: no index of its own.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="secrets", db_index=False
    )
    name = models.CharField(max_length=64)
    # A Fernet token of the value bound to its tenant and name; `key_id` is the
    # fingerprint of the key that made it (rotate_secret_keys re-encrypts).
    ciphertext = models.TextField()
    key_id = models.CharField(max_length=16)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "name"], name="secret_name_unique_per_tenant"
            )
        ]

    def __str__(self) -> str:
        return f"secret {self.name} of {self.tenant_id}"


__all__ = [
    "ApiToken",
    "AuditEvent",
    "Membership",
    "PasswordLink",
    "Role",
    "Secret",
    "Tenant",
]
