"""Steering and follow-up messages: what a person (or an API client) sent to a
run, waiting in the run's queue until the lease holder delivers it at the next
turn boundary (spec §1.3, single writer with a steering queue).

A row is written `queued` by the API and changed once, to `delivered`, in the
transaction that stores the engine state whose transcript carries it: the two
commit together or not at all, so a step that crashes and runs again delivers
the message once.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from controlplane.models import Tenant

__all__ = ["RunMessage"]


class RunMessage(models.Model):
    class State(models.TextChoices):
        QUEUED = "queued"
        DELIVERED = "delivered"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    # A string reference: runs.models imports this module.
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="messages"
    )
    text = models.TextField()
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    # Kept as sent: the user row may be deleted, the record of who spoke stays.
    author_name = models.CharField(max_length=150, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # The index of the step whose model call first saw it.
    delivered_before_step = models.IntegerField(null=True, blank=True)
    # The session log entry that holds it (8 hex digits).
    entry_id = models.CharField(max_length=8, blank=True)

    class Meta:
        ordering = ["run", "created_at", "id"]
        indexes = [models.Index(fields=["run", "state", "created_at"])]

    def __str__(self) -> str:
        return f"{self.run_id} message {self.id} ({self.state})"
