"""Writes for a tenant's approval policy: rules and settings, validated and audited.

A rule's conditions are checked against the tools it can match; runs owns the tool
registry and passes their contracts in (`known_tools`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.forms.models import model_to_dict

from approvals.models import ApprovalPolicyRule, TenantApprovalSettings
from approvals.policy import (
    APPROVER_ROLE_CHOICES,
    conditions_problems,
    effects_problems,
    glob_problem,
)
from controlplane.models import Tenant
from controlplane.services import audit_record
from runs.engine.contracts import ToolContract

RULE_FIELDS = {
    "position",
    "name",
    "tool",
    "effects",
    "source",
    "conditions",
    "action",
    "ttl_seconds",
    "approver_roles",
    "approvals_required",
    "starter_may_approve",
}
REQUIRED_RULE_FIELDS = {"name", "action"}
MAX_TTL_SECONDS = 30 * 24 * 3600


class RuleInputError(ValueError):
    """The rule is malformed; carries a message per field. Nothing was written."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {', '.join(v)}" for k, v in fields.items()))
        self.fields = fields


def _int(value: Any, low: int, high: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return "must be an integer"
    if not low <= value <= high:
        return f"must be between {low} and {high}"
    return None


def rule_validate(
    data: Any,
    *,
    known_tools: Mapping[str, ToolContract],
    partial_of: ApprovalPolicyRule | None = None,
) -> dict[str, Any]:
    """The rule's fields, checked; RuleInputError names every problem."""
    if not isinstance(data, dict):
        raise RuleInputError({"non_field_errors": ["a rule is a JSON object"]})
    problems: dict[str, list[str]] = {}

    def problem(field: str, message: str) -> None:
        problems.setdefault(field, []).append(message)

    for unknown in sorted(set(data) - RULE_FIELDS):
        problem(unknown, f"unknown field; rules have {', '.join(sorted(RULE_FIELDS))}")
    base: dict[str, Any] = (
        {name: getattr(partial_of, name) for name in RULE_FIELDS} if partial_of else {}
    )
    rule = {**base, **{k: v for k, v in data.items() if k in RULE_FIELDS}}
    for field in sorted(REQUIRED_RULE_FIELDS - set(rule)):
        problem(field, "this field is required")
    name = rule.get("name")
    if "name" in rule and (
        not isinstance(name, str) or not 1 <= len(name.strip()) <= 100
    ):
        problem("name", "must be a non-empty string of at most 100 characters")
    rule.setdefault("tool", "*")
    if not isinstance(rule["tool"], str):
        problem("tool", "must be a string glob")
    elif (why := glob_problem(rule["tool"])) is not None:
        problem("tool", why)
    rule.setdefault("effects", [])
    for why in effects_problems(rule["effects"]):
        problem("effects", why)
    rule.setdefault("source", "any")
    if rule["source"] not in ApprovalPolicyRule.Source.values:
        problem(
            "source", f"must be one of {', '.join(ApprovalPolicyRule.Source.values)}"
        )
    if "action" in rule and rule["action"] not in ApprovalPolicyRule.Action.values:
        problem(
            "action", f"must be one of {', '.join(ApprovalPolicyRule.Action.values)}"
        )
    rule.setdefault("conditions", [])
    if "tool" not in problems:
        for why in conditions_problems(rule["tool"], rule["conditions"], known_tools):
            problem("conditions", why)
    rule.setdefault("position", 0)
    if (why := _int(rule["position"], 0, 1_000_000)) is not None:
        problem("position", why)
    rule.setdefault("ttl_seconds", None)
    if rule["ttl_seconds"] is not None and (
        why := _int(rule["ttl_seconds"], 1, MAX_TTL_SECONDS)
    ):
        problem("ttl_seconds", why)
    rule.setdefault("approver_roles", list(APPROVER_ROLE_CHOICES))
    roles = rule["approver_roles"]
    if (
        not isinstance(roles, list)
        or not roles
        or any(r not in APPROVER_ROLE_CHOICES for r in roles)
    ):
        problem(
            "approver_roles", f"a non-empty list of {', '.join(APPROVER_ROLE_CHOICES)}"
        )
    rule.setdefault("approvals_required", 1)
    if (why := _int(rule["approvals_required"], 1, 10)) is not None:
        problem("approvals_required", why)
    rule.setdefault("starter_may_approve", True)
    if not isinstance(rule["starter_may_approve"], bool):
        problem("starter_may_approve", "must be true or false")
    if problems:
        raise RuleInputError(problems)
    rule["name"] = rule["name"].strip()
    return rule


def rule_view(rule: ApprovalPolicyRule) -> dict[str, Any]:
    view = model_to_dict(rule, fields=sorted(RULE_FIELDS))
    view["id"] = str(rule.id)
    return view


@transaction.atomic
def approval_rule_create(
    *,
    tenant: Tenant,
    actor: User,
    data: Any,
    known_tools: Mapping[str, ToolContract],
    remote_addr: str | None = None,
) -> ApprovalPolicyRule:
    fields = rule_validate(data, known_tools=known_tools)
    rule = ApprovalPolicyRule.objects.create(tenant=tenant, **fields)
    audit_record(
        tenant=tenant, actor=actor, action="approval_rule.create",
        object_type="approval_rule", object_id=str(rule.id),
        after=rule_view(rule), remote_addr=remote_addr,
    )  # fmt: skip
    return rule


@transaction.atomic
def approval_rule_update(
    *,
    rule: ApprovalPolicyRule,
    actor: User,
    data: Any,
    known_tools: Mapping[str, ToolContract],
    remote_addr: str | None = None,
) -> ApprovalPolicyRule:
    """Change some fields of a rule (the others stay)."""
    before = rule_view(rule)
    fields = rule_validate(data, known_tools=known_tools, partial_of=rule)
    for name, value in fields.items():
        setattr(rule, name, value)
    rule.save()
    audit_record(
        tenant=rule.tenant, actor=actor, action="approval_rule.update",
        object_type="approval_rule", object_id=str(rule.id),
        before=before, after=rule_view(rule), remote_addr=remote_addr,
    )  # fmt: skip
    return rule


@transaction.atomic
def approval_rule_delete(
    *, rule: ApprovalPolicyRule, actor: User, remote_addr: str | None = None
) -> None:
    audit_record(
        tenant=rule.tenant, actor=actor, action="approval_rule.delete",
        object_type="approval_rule", object_id=str(rule.id),
        before=rule_view(rule), remote_addr=remote_addr,
    )  # fmt: skip
    rule.delete()


@transaction.atomic
def approval_settings_set(
    *,
    tenant: Tenant,
    actor: User,
    deny_reason_required: bool,
    remote_addr: str | None = None,
) -> TenantApprovalSettings:
    current, _ = TenantApprovalSettings.objects.get_or_create(tenant=tenant)
    before = {"deny_reason_required": current.deny_reason_required}
    current.deny_reason_required = deny_reason_required
    current.save()
    audit_record(
        tenant=tenant, actor=actor, action="approval_settings.update",
        object_type="approval_settings", object_id=str(tenant.id),
        before=before, after={"deny_reason_required": deny_reason_required},
        remote_addr=remote_addr,
    )  # fmt: skip
    return current
