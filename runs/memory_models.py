"""What the `memory` tool keeps about an end user across runs (docs/memory.md).

A file is one path in one end user's store of one tenant; it holds dated entries
(`[{"date": "2026-10-29", "text": "chose replacement", "key": ...}]`). `key` is
the idempotency key of the call that last wrote the entry, so a call re-run
after a crash does not write twice.
"""

from __future__ import annotations

import uuid

from django.db import models

from controlplane.models import Tenant

__all__ = ["MemoryFile"]


class MemoryFile(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="memory_files"
    )
    end_user = models.CharField(max_length=128)
    # Normalised, always under /memories/ (runs.memory_paths).
    path = models.CharField(max_length=255)
    entries = models.JSONField(default=list)
    # The characters of its entries' texts (the per-user limit sums these).
    size_chars = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["path"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "end_user", "path"],
                name="one_memory_file_per_user_path",
            )
        ]
        indexes = [
            # Retention deletes a tenant's files not written since its cutoff.
            models.Index(fields=["tenant", "updated_at"], name="memory_file_age"),
        ]

    def __str__(self) -> str:
        return f"{self.end_user}:{self.path}"
