"""The session log's rows: one per entry of a run's history (spec §1.1).

Entries are inserted, never updated: the lease holder appends them with the
write that stores the engine state, at the next `seq`. `(run, seq)` is unique,
so a second writer that somehow got past the lease check would fail its insert
instead of forking the log silently.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

__all__ = ["SessionEntry"]


class SessionEntry(models.Model):
    class Type(models.TextChoices):
        MESSAGE = "message"
        COMPACTION = "compaction"
        BRANCH_SUMMARY = "branch_summary"
        CONTEXT_EDIT = "context_edit"
        CUSTOM = "custom"
        CUSTOM_MESSAGE = "custom_message"
        MODEL_CHANGE = "model_change"
        USAGE = "usage"
        LABEL = "label"

    id = models.BigAutoField(primary_key=True)
    # A string reference: runs.models imports this module.
    run = models.ForeignKey(
        "runs.Run",
        on_delete=models.CASCADE,
        related_name="session_entries",
        db_index=False,  # the (run, seq) index serves it
    )
    seq = models.BigIntegerField()
    entry_id = models.CharField(max_length=8)
    parent_id = models.CharField(max_length=8, blank=True)  # "": the root
    type = models.CharField(max_length=32, choices=Type.choices)
    payload = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "seq"], name="one_session_entry_per_seq"
            ),
            models.UniqueConstraint(
                fields=["run", "entry_id"], name="one_session_entry_per_id"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.seq} {self.type}"
