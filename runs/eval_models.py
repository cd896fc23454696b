"""Evaluation suites, their cases, and the eval runs that try an agent version on
them (DESIGN.md §3; docs/evals.md).

A case's definition (world setup, graders, scripted approvals) is JSON checked by
`runs.evals.definitions` before it is written; these models only hold it. Rows of
the runs app are named by string (`"runs.Run"`) so `runs.models` can import this
module at its top.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from controlplane.models import Tenant

__all__ = ["EvalCase", "EvalRun", "EvalSuite", "EvalTrial"]


class EvalSuite(models.Model):
    """A tenant's named set of cases, kept as one YAML file in a team's repository."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="eval_suites"
    )
    slug = models.SlugField(max_length=64)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    # The agent a suite is meant for ("" for none): its slug, so a suite file
    # names it the same way in every tenant.
    default_agent = models.SlugField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "slug"], name="eval_suite_slug_per_tenant"
            )
        ]

    def __str__(self) -> str:
        return self.slug


class EvalCase(models.Model):
    """One task: an input, the world it starts in, how it is graded, and how the
    approvals it meets are decided (so a suite runs unattended)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    suite = models.ForeignKey(EvalSuite, on_delete=models.CASCADE, related_name="cases")
    slug = models.SlugField(max_length=64)
    position = models.PositiveIntegerField(default=0)
    input = models.TextField()
    # {"orders": [...]}: demo-shop rows created fresh for each trial.
    world = models.JSONField(default=dict, blank=True)
    # [{"kind": "must_call", "tool": ...}, ...]: every one must pass.
    graders = models.JSONField(default=list)
    # [{"tool": ..., "decision": "approve" | "deny" | "edit", ...}, ...]
    approvals = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["suite", "position", "slug"]
        constraints = [
            models.UniqueConstraint(
                fields=["suite", "slug"], name="eval_case_slug_per_suite"
            )
        ]

    def __str__(self) -> str:
        return f"{self.suite_id}/{self.slug}"


class EvalRun(models.Model):
    """A suite tried against one agent version, k trials per case; or against an
    agent that runs outside (`external_agent`), whose client reports each trial's
    trace (docs/evals.md, "Agents that run outside")."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        FINISHED = "finished"  # every trial ran and was graded
        FAILED = "failed"  # could not finish (summary says why)
        CANCELLED = "cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    # A suite with eval runs is kept: their results refer to its cases.
    suite = models.ForeignKey(
        EvalSuite, on_delete=models.PROTECT, related_name="eval_runs"
    )
    # Exactly one of the two: a hosted agent's version, or the name an
    # external agent's eval runs go by (its trials' runs are OTLP-ingested).
    agent_version = models.ForeignKey(
        "runs.AgentVersion",
        on_delete=models.PROTECT,
        related_name="eval_runs",
        null=True,
        blank=True,
    )
    external_agent = models.CharField(max_length=64, blank=True)
    k = models.PositiveSmallIntegerField()
    status = models.CharField(
        max_length=12, choices=Status.choices, default=Status.QUEUED
    )
    # The suite as it was when the eval run started (its export's shape), so
    # later edits do not change what this run measured.
    suite_snapshot = models.JSONField(default=dict)
    # pass@1, pass@k, pass^k, intervals, cost... (runs.engine.eval_metrics).
    summary = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "-created_at"])]
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(agent_version__isnull=False, external_agent="")
                    | (
                        models.Q(agent_version__isnull=True)
                        & ~models.Q(external_agent="")
                    )
                ),
                name="eval_run_hosted_or_external",
            )
        ]

    def __str__(self) -> str:
        return f"eval run {self.id} ({self.status})"

    @property
    def agent_name(self) -> str:
        """The hosted agent's slug, or the external agent's name."""
        if self.agent_version is not None:
            return self.agent_version.agent.slug
        return self.external_agent

    @property
    def version_number(self) -> int | None:
        """The hosted agent version's number; None for an external agent."""
        return self.agent_version.number if self.agent_version is not None else None


class EvalTrial(models.Model):
    """One real run of one case in an eval run, and how its graders judged it."""

    class Status(models.TextChoices):
        PENDING = "pending"  # its run is not started (external: not reported) yet
        RUNNING = "running"
        GRADED = "graded"  # passed says the verdict
        ERROR = "error"  # a grader could not judge (e.g. its judge was down)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    eval_run = models.ForeignKey(
        EvalRun, on_delete=models.CASCADE, related_name="trials"
    )
    case = models.ForeignKey(
        EvalCase, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # The case's slug when the trial was made (the case may be edited or removed).
    case_slug = models.SlugField(max_length=64)
    index = models.PositiveSmallIntegerField()  # 0..k-1
    run = models.OneToOneField(
        "runs.Run",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="eval_trial",
    )
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.PENDING
    )
    passed = models.BooleanField(null=True, blank=True)
    # [{"kind", "passed", "reason", "error"?}, ...] in the case's grader order.
    grader_results = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    graded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["eval_run", "case_slug", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["eval_run", "case_slug", "index"], name="one_trial_per_index"
            )
        ]

    def __str__(self) -> str:
        return f"trial {self.case_slug}#{self.index} ({self.status})"
