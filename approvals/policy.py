"""The tenant's approval policy as the engine's policy hook.

Rules are data, never code: a glob on the tool name, the tool's effect, its source
and conditions on arguments in a small structured language
(`{"arg": "amount", "op": ">", "value": 100}`), evaluated without `eval`. The
first matching rule decides; without a match the defaults apply (read-only tools
from trusted sources run, everything else waits for a human). Nobody who may
decide → deny. Anything that raises here is a deny (the engine's `decide_policy`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings

from approvals.models import (
    DEFAULT_APPROVER_ROLES,
    ApprovalPolicyRule,
    ApprovalRequest,
)
from controlplane.models import Membership
from controlplane.rows import Select, instances_select
from runs.engine.contracts import Effect, ToolContract
from runs.engine.policy import PolicyAction, PolicyContext, PolicyDecision
from runs.models import Run

RULE_PREFIX = "tenant_rule:"
# `PolicyContext.attributes` key: the tenant's rules, if the host read them
# already (with other reads before the call, in one round trip).
RULES_READ = "cp.policy_rules"
GLOB_PATTERN = re.compile(r"^[A-Za-z0-9_*?\[\]!-]{1,64}$")
APPROVER_ROLE_CHOICES = ("admin", "operator")


class PolicyEvaluationError(Exception):
    """A condition cannot be evaluated on these arguments (the call is denied)."""


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyEvaluationError(f"{value!r} is not a number")
    return float(value)


def _ordered(compare: Callable[[float, float], bool]) -> Callable[[Any, Any], bool]:
    return lambda left, right: compare(_number(left), _number(right))


def _member(left: Any, right: Any) -> bool:
    if not isinstance(right, list):
        raise PolicyEvaluationError("`in` needs a list")
    return left in right


OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda left, right: bool(left == right),
    "!=": lambda left, right: bool(left != right),
    "<": _ordered(lambda a, b: a < b),
    "<=": _ordered(lambda a, b: a <= b),
    ">": _ordered(lambda a, b: a > b),
    ">=": _ordered(lambda a, b: a >= b),
    "in": _member,
    "not_in": lambda left, right: not _member(left, right),
}
NUMERIC_OPERATORS = {"<", "<=", ">", ">="}


def condition_holds(condition: Mapping[str, Any], arguments: Mapping[str, Any]) -> bool:
    """One condition; an absent argument never matches, a type mismatch raises."""
    name = condition["arg"]
    if name not in arguments:
        return False
    return OPERATORS[condition["op"]](arguments[name], condition["value"])


def rule_matches(
    rule: ApprovalPolicyRule, contract: ToolContract, arguments: Mapping[str, Any]
) -> bool:
    if not fnmatch.fnmatchcase(contract.name, rule.tool):
        return False
    if rule.effects and str(contract.effective_effect) not in rule.effects:
        return False
    if rule.source == ApprovalPolicyRule.Source.TRUSTED and not contract.trusted:
        return False
    if rule.source == ApprovalPolicyRule.Source.UNTRUSTED and contract.trusted:
        return False
    return all(condition_holds(c, arguments) for c in rule.conditions)


def eligible_approvers(
    *, tenant_id: str, roles: list[str], exclude_user_id: int | None = None
) -> int:
    """How many members may decide under these roles (viewers never may)."""
    allowed = [r for r in roles if r in APPROVER_ROLE_CHOICES]
    members = Membership.objects.filter(
        tenant_id=tenant_id, role__in=allowed, user__is_active=True
    )
    if exclude_user_id is not None:
        members = members.exclude(user_id=exclude_user_id)
    return members.count()


def _approver_available(
    context: PolicyContext, roles: list[str], required: int, starter_may: bool
) -> bool:
    if not context.approver_available:  # headless: the host says nobody is there
        return False
    starter_id = None
    if not starter_may:
        starter_id = (
            Run.objects.filter(id=context.run_id)
            .values_list("started_by_id", flat=True)
            .first()
        )
    available = eligible_approvers(
        tenant_id=context.tenant_id, roles=roles, exclude_user_id=starter_id
    )
    return available >= required


def _run_scope_grant(
    context: PolicyContext, contract: ToolContract, rule: str
) -> ApprovalRequest | None:
    """An earlier `scope: run` approval of this tool under this rule in this run,
    whose approvers still hold a role that may approve."""
    from approvals.services import approvers_still_allowed_problem

    grants = ApprovalRequest.objects.filter(
        run_id=context.run_id,
        tool_name=contract.name,
        rule=rule,
        scope=ApprovalRequest.Scope.RUN,
        status=ApprovalRequest.Status.APPROVED,
    ).order_by("decided_at")
    for grant in grants:
        if approvers_still_allowed_problem(grant) is None:
            return grant
    return None


def tenant_policy(
    contract: ToolContract, arguments: Mapping[str, Any], context: PolicyContext
) -> PolicyDecision:
    """The engine's policy hook (settings.RUN_POLICY_HOOK)."""
    rules = context.attributes.get(RULES_READ)
    if rules is None:
        rules = policy_rules_select(context.tenant_id).run()
    for rule in rules:
        if not rule_matches(rule, contract, arguments):
            continue
        name = f"{RULE_PREFIX}{rule.id}"
        if rule.action == ApprovalPolicyRule.Action.ALLOW:
            return PolicyDecision(PolicyAction.ALLOW, name, f"allowed by {rule.name}")
        if rule.action == ApprovalPolicyRule.Action.DENY:
            return PolicyDecision(PolicyAction.DENY, name, f"denied by {rule.name}")
        grant = _run_scope_grant(context, contract, name)
        if grant is not None:
            return PolicyDecision(
                PolicyAction.ALLOW,
                name,
                f"approved for the whole run by approval {grant.id} ({rule.name})",
            )
        if not _approver_available(
            context, rule.approver_roles, rule.approvals_required,
            rule.starter_may_approve,
        ):  # fmt: skip
            return PolicyDecision(
                PolicyAction.DENY,
                name,
                f"{rule.name} needs {rule.approvals_required} approver(s) with "
                f"role {' or '.join(rule.approver_roles)} and this tenant has none",
            )
        return PolicyDecision(
            PolicyAction.REQUIRE_APPROVAL,
            name,
            f"{contract.name} needs approval under rule {rule.name}",
            ttl_seconds=rule.ttl_seconds or settings.APPROVAL_DEFAULT_TTL_SECONDS,
        )
    return _default_decision(contract, context)


def policy_rules_select(tenant_id: Any) -> Select:
    """The tenant's rules in the order they apply, to run with other reads; pass
    what it found as `PolicyContext.attributes[RULES_READ]`."""
    return instances_select(
        ApprovalPolicyRule, {"tenant": tenant_id}, order_by=["position", "created_at"]
    )


def _default_decision(contract: ToolContract, context: PolicyContext) -> PolicyDecision:
    if contract.is_read_only:
        return PolicyDecision(
            PolicyAction.ALLOW,
            "default.read_only",
            "read-only tool from a trusted source",
        )
    grant = _run_scope_grant(context, contract, "default.side_effect")
    if grant is not None:
        return PolicyDecision(
            PolicyAction.ALLOW,
            "default.side_effect",
            f"approved for the whole run by approval {grant.id}",
        )
    if not _approver_available(context, list(DEFAULT_APPROVER_ROLES), 1, True):
        return PolicyDecision(
            PolicyAction.DENY,
            "default.no_approver",
            f"{contract.name} has side effects and nobody in this tenant may "
            "approve it",
        )
    claim = "" if contract.trusted else " (untrusted source: its claims are ignored)"
    return PolicyDecision(
        PolicyAction.REQUIRE_APPROVAL,
        "default.side_effect",
        f"{contract.name} has effect {contract.effective_effect}{claim} and needs "
        "approval",
        ttl_seconds=settings.APPROVAL_DEFAULT_TTL_SECONDS,
    )


# --- validation of rules at save time -------------------------------------------


def _known_tools() -> dict[str, ToolContract]:
    from runs.tools.registry import BUILTIN_TOOLS

    return {name: tool.contract for name, tool in BUILTIN_TOOLS.items()}


def glob_problem(glob: str) -> str | None:
    if not GLOB_PATTERN.match(glob):
        return "a tool glob uses letters, digits, _ - * ? ! and [...] (1-64 chars)"
    depth = 0
    for char in glob:
        if char == "[":
            if depth:
                return "nested [ in the tool glob"
            depth = 1
        elif char == "]":
            if not depth:
                return "unbalanced ] in the tool glob"
            depth = 0
    if depth:
        return "unclosed [ in the tool glob"
    return None


def conditions_problems(tool_glob: str, conditions: Any) -> list[str]:
    """Why these conditions are unusable for the tools the glob matches, if so."""
    if not isinstance(conditions, list):
        return ["conditions must be a list of {arg, op, value} objects"]
    if not conditions:
        return []
    tools = {
        name: contract
        for name, contract in _known_tools().items()
        if fnmatch.fnmatchcase(name, tool_glob)
    }
    if not tools:
        return [f"conditions need a tool glob that matches a known tool: {tool_glob!r}"]
    problems: list[str] = []
    for index, condition in enumerate(conditions):
        where = f"conditions[{index}]"
        if not isinstance(condition, dict) or set(condition) != {"arg", "op", "value"}:
            problems.append(f"{where}: must have exactly the keys arg, op and value")
            continue
        arg, op, value = condition["arg"], condition["op"], condition["value"]
        if op not in OPERATORS:
            problems.append(f"{where}: unknown op {op!r}; use {', '.join(OPERATORS)}")
            continue
        if op in ("in", "not_in") and not isinstance(value, list):
            problems.append(f"{where}: {op} needs a list value")
        if op in NUMERIC_OPERATORS and (
            isinstance(value, bool) or not isinstance(value, int | float)
        ):
            problems.append(f"{where}: {op} needs a number value")
        for name, contract in tools.items():
            properties = contract.input_schema.get("properties") or {}
            if arg not in properties:
                problems.append(f"{where}: tool {name} has no argument {arg!r}")
                continue
            kind = properties[arg].get("type")
            if op in NUMERIC_OPERATORS and kind not in ("number", "integer"):
                problems.append(
                    f"{where}: {op} compares numbers but {name}.{arg} is {kind}"
                )
    return problems


def effects_problems(effects: Any) -> list[str]:
    if not isinstance(effects, list):
        return ["effects must be a list"]
    known = {str(e) for e in Effect}
    return [
        f"unknown effect {e!r}; use {', '.join(sorted(known))}"
        for e in effects
        if e not in known
    ]
