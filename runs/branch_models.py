"""Branches of a session: which runs share one session tree (retry and fork,
docs/engine.md "Branches").

A retry or a fork is a new Run (its own status, steps, spans, trace and budget
reservation) whose session log continues the tree of the run it came from: its
first entry's parent is an entry of that run's path. A `SessionBranch` row says
so; the session's first run gets one (number 0) when it is first branched, so
that every run of a session is found by `session_root`. Runs are named by
string ("runs.Run") so that `runs.models` can import this module.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

__all__ = ["SessionBranch"]


class SessionBranch(models.Model):
    class Kind(models.TextChoices):
        ROOT = "root"  # the session's first run
        RETRY = "retry"
        FORK = "fork"
        # Made by the host, not a person: the run's model call overflowed the
        # window, and the branch compacts and asks again (runs.services.settle).
        RECOVERY = "recovery"

    run = models.OneToOneField(
        "runs.Run", on_delete=models.CASCADE, primary_key=True, related_name="branch"
    )
    # The session's first run: every branch of one tree names the same one.
    session_root = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="session_branches"
    )
    # The run it was made from (None: the root) and the entry of that run's path
    # its log continues after (the parent of its first entry).
    branch_of = models.ForeignKey(
        "runs.Run",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="child_branches",
    )
    from_entry = models.CharField(max_length=8, blank=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    # Unique in the session: the branch's entry ids start at `number << 24`, so
    # that an entry id names one entry in the whole tree (runs.engine.branching).
    number = models.PositiveSmallIntegerField()
    # What a fork changed: {"target": entry id, "field": "message"|"tool_result"}.
    edit = models.JSONField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["session_root", "number"], name="one_branch_number_per_session"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.number} of session {self.session_root_id}"
