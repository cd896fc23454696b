"""Runs flagged for a person to look at: a guardrail tripped or could not run
(docs/agents.md, Guardrails). Listed in the approvals inbox until reviewed."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from controlplane.models import Tenant


class RunReview(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        REVIEWED = "reviewed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="reviews"
    )
    # What flagged it: the guardrail's name, its stage and verdict.
    guardrail = models.CharField(max_length=64)
    stage = models.CharField(max_length=8)
    verdict = models.CharField(max_length=16)
    reason = models.TextField(blank=True)
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.OPEN
    )
    created_at = models.DateTimeField(auto_now_add=True)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "status", "-created_at"])]
        constraints = [
            # A step taken again after a crash flags the run once.
            models.UniqueConstraint(
                fields=["run", "guardrail", "stage"], name="one_review_per_guardrail"
            )
        ]

    def __str__(self) -> str:
        return f"review of {self.run_id}: {self.guardrail} ({self.status})"
