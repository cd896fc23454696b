"""The tenant's approval rules: how one matches a call, and the checks it gets
when it is saved.

Rules are data, never code: a glob on the tool name, the tool's effect, its source
and conditions on arguments in a small structured language
(`{"arg": "amount", "op": ">", "value": 100}`), evaluated without `eval`. The hook
that applies them to a run's call (first match decides, the defaults, grants for
the whole run, nobody who may decide → deny) is runs/services/policy.py: it reads
the run, which this app never imports.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from typing import Any

from approvals.models import ApprovalPolicyRule
from controlplane.models import Membership
from controlplane.permissions import Action, roles_that_may
from runs.engine.contracts import Effect, ToolContract

RULE_PREFIX = "tenant_rule:"
# `PolicyContext.attributes` key: the tenant's rules, if the host read them
# already (with other reads before the call, in one round trip).
RULES_READ = "cp.policy_rules"
GLOB_PATTERN = re.compile(r"^[A-Za-z0-9_*?\[\]!-]{1,64}$")
# The roles a rule may name as approvers: those the permission matrix lets decide.
APPROVER_ROLE_CHOICES = roles_that_may(Action.APPROVAL_DECIDE)


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
        tenant_id=tenant_id,
        role__in=allowed,
        user__is_active=True,
        deactivated_at__isnull=True,
    )
    if exclude_user_id is not None:
        members = members.exclude(user_id=exclude_user_id)
    return members.count()


def policy_rules_for(tenant_id: Any) -> list[ApprovalPolicyRule]:
    """The tenant's rules in the order they apply; a caller that read them already
    passes them as `PolicyContext.attributes[RULES_READ]`."""
    return list(
        ApprovalPolicyRule.objects.filter(tenant_id=tenant_id).order_by(
            "position", "created_at"
        )
    )


def rule_of(decision: Mapping[str, Any]) -> ApprovalPolicyRule | None:
    """The tenant rule a policy decision names, if it names one that still exists."""
    name = str(decision.get("rule", ""))
    if not name.startswith(RULE_PREFIX):
        return None
    return ApprovalPolicyRule.objects.filter(id=name[len(RULE_PREFIX) :]).first()


# --- validation of rules at save time -------------------------------------------


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


def conditions_problems(
    tool_glob: str, conditions: Any, known_tools: Mapping[str, ToolContract]
) -> list[str]:
    """Why these conditions are unusable for the tools the glob matches, if so
    (`known_tools`: the contracts rules are written against, from runs)."""
    if not isinstance(conditions, list):
        return ["conditions must be a list of {arg, op, value} objects"]
    if not conditions:
        return []
    tools = {
        name: contract
        for name, contract in known_tools.items()
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
