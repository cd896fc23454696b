"""Approval policies per tenant, approval requests and the decisions on them.

Approvals sit below `runs`: a request names its run and tool call by string
foreign key, and `runs` (which asks, and resumes after a decision) imports this.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from controlplane.models import Tenant
from controlplane.permissions import Action, roles_that_may

# Who decides when a rule names nobody else: every role the permission matrix lets
# decide approvals (admin, operator).
DEFAULT_APPROVER_ROLES = list(roles_that_may(Action.APPROVAL_DECIDE))


def default_approver_roles() -> list[str]:
    return list(DEFAULT_APPROVER_ROLES)


class ApprovalPolicyRule(models.Model):
    """One ordered rule of a tenant's approval policy; the first match decides."""

    class Action(models.TextChoices):
        ALLOW = "allow"
        REQUIRE_APPROVAL = "require_approval"
        DENY = "deny"

    class Source(models.TextChoices):
        ANY = "any"
        TRUSTED = "trusted"  # builtin or trusted registry
        UNTRUSTED = "untrusted"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="approval_rules"
    )
    position = models.PositiveIntegerField(default=0)
    name = models.CharField(max_length=100)
    tool = models.CharField(max_length=64, default="*")  # a glob on the tool name
    effects = models.JSONField(default=list, blank=True)  # empty: any effect
    source = models.CharField(max_length=16, choices=Source.choices, default="any")
    conditions = models.JSONField(default=list, blank=True)  # all must hold
    action = models.CharField(max_length=20, choices=Action.choices)
    ttl_seconds = models.PositiveIntegerField(null=True, blank=True)
    approver_roles = models.JSONField(default=default_approver_roles)
    approvals_required = models.PositiveSmallIntegerField(default=1)
    starter_may_approve = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["position", "created_at"]

    def __str__(self) -> str:
        return f"{self.name}: {self.tool} → {self.action}"


class TenantApprovalSettings(models.Model):
    tenant = models.OneToOneField(
        Tenant, on_delete=models.CASCADE, related_name="approval_settings"
    )
    deny_reason_required = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"approval settings of {self.tenant_id}"


class ApprovalRequest(models.Model):
    """A decision a run waits for: a gated tool call, a budget extension (a
    reservation was refused and the tenant asked to be asked, docs/budgets.md),
    or a tool error (a tool failed twice alike and its contract asks a person
    whether the run may go on, docs/engine.md), or an external call (a tool call
    of an agent running elsewhere, asked over HTTP: runs' ExternalGate, with no
    ToolCall row; docs/external-agents.md)."""

    class Kind(models.TextChoices):
        TOOL_CALL = "tool_call"
        BUDGET_EXTENSION = "budget_extension"
        TOOL_ERROR = "tool_error"
        EXTERNAL_CALL = "external_call"

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
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="approvals"
    )
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="approvals"
    )
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.TOOL_CALL)
    tool_call = models.OneToOneField(
        "runs.ToolCall",
        on_delete=models.CASCADE,
        related_name="approval",
        null=True,  # a budget extension gates no tool call
        blank=True,
    )
    # For a budget extension: what to extend, by how much, and why it was refused.
    extension = models.JSONField(null=True, blank=True)
    tool_name = models.CharField(max_length=200)
    rule = models.CharField(max_length=200)
    rule_ref = models.ForeignKey(
        ApprovalPolicyRule,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="requests",
    )
    rule_reason = models.TextField(blank=True)
    approver_roles = models.JSONField(default=default_approver_roles)
    approvals_required = models.PositiveSmallIntegerField(default=1)
    starter_may_approve = models.BooleanField(default=True)
    args_snapshot = models.JSONField()
    args_sha256 = models.CharField(max_length=64)
    original_args = models.JSONField(null=True, blank=True)  # set when edited
    args_edited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True
    )
    scope = models.CharField(max_length=8, choices=Scope.choices, default=Scope.ONCE)
    requested_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)
    version = models.PositiveIntegerField(default=0)  # bumped to serialise deciders
    # Who asked, when not the run's starter: an external agent's token user
    # (`external_call`); a rule that keeps the starter from approving keeps them.
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )

    class Meta:
        indexes = [models.Index(fields=["tenant", "status", "requested_at"])]

    def __str__(self) -> str:
        if self.kind == self.Kind.BUDGET_EXTENSION:
            return f"budget extension ({self.status})"
        if self.kind == self.Kind.TOOL_ERROR:
            return f"repeated error of {self.tool_name} ({self.status})"
        if self.kind == self.Kind.EXTERNAL_CALL:
            return f"approval of external {self.tool_name} ({self.status})"
        return f"approval of {self.tool_name} ({self.status})"


class ApprovalDecision(models.Model):
    """One approver's vote; a request needs `approvals_required` distinct ones."""

    class Decision(models.TextChoices):
        APPROVE = "approve"
        DENY = "deny"

    request = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="decisions"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    decision = models.CharField(max_length=8, choices=Decision.choices)
    reason = models.TextField(blank=True)
    args_sha256 = models.CharField(max_length=64)  # the arguments this vote was for
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["request", "user"], name="one_decision_per_approver"
            )
        ]

    def __str__(self) -> str:
        return f"{self.decision} by {self.user_id}"


class Question(models.Model):
    """A question a run asks a person and waits for (status `waiting_input`):
    the built-in `ask_human` tool's, or an MCP server's elicitation during a
    tool call. The answer becomes the call's observation (runs.services.questions).
    """

    class Kind(models.TextChoices):
        ASK_HUMAN = "ask_human"
        ELICITATION = "elicitation"  # an MCP server's `elicitation/create`

    class Status(models.TextChoices):
        PENDING = "pending"
        ANSWERED = "answered"
        EXPIRED = "expired"
        CANCELLED = "cancelled"  # its run was cancelled

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="questions"
    )
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="questions"
    )
    # An MCP call may ask more than once (each answer re-runs the call).
    tool_call = models.ForeignKey(
        "runs.ToolCall", on_delete=models.CASCADE, related_name="questions"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    question = models.TextField()
    choices = models.JSONField(default=list, blank=True)  # empty: free text
    # An elicitation's `requestedSchema` (what the server wants filled in).
    schema = models.JSONField(null=True, blank=True)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True
    )
    answer = models.TextField(blank=True)
    answered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    answered_at = models.DateTimeField(null=True, blank=True)
    asked_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "status", "asked_at"])]

    def __str__(self) -> str:
        return f"question of {self.run_id} ({self.status})"
