"""Approval requests: a risky tool call waits here for a human decision."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from controlplane.models import Tenant
from runs.models import Run, ToolCall


class ApprovalRequest(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        DENIED = "denied"
        EXPIRED = "expired"
        CANCELLED = "cancelled"

    class Scope(models.TextChoices):
        ONCE = "once"
        RUN = "run"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="approvals")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    tool_call = models.OneToOneField(
        ToolCall, on_delete=models.CASCADE, related_name="approval"
    )
    tool_name = models.CharField(max_length=200)
    rule = models.CharField(max_length=200)
    rule_reason = models.TextField(blank=True)
    args_snapshot = models.JSONField()
    args_sha256 = models.CharField(max_length=64)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True
    )
    scope = models.CharField(max_length=8, choices=Scope.choices, default=Scope.ONCE)
    requested_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "status", "requested_at"])]

    def __str__(self) -> str:
        return f"approval of {self.tool_name} ({self.status})"
