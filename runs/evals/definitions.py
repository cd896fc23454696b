"""The strict shape of a suite, a case, a grader, a scripted approval and a
case's world setup: what the API and a suite's YAML file may say.

Checked here, before anything is written: an unknown key or a bad value is an
error naming its path (`cases[2].graders[0].tol`), so a typo in a suite file is
refused instead of silently grading less. Pure: no database.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

MAX_CASES = 500
MAX_GRADERS = 50
MAX_APPROVALS = 50
MAX_ORDERS = 50
MAX_INPUT_CHARS = 100_000
MAX_TEXT_CHARS = 10_000
SLUG = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")
ORDER_ID = re.compile(r"^[0-9]{4}$")
# `$`, `$.order_id`, `items[0].sku`: keys and list indices, nothing else.
PATH = re.compile(r"^\$?(?:(?:^|\.)[A-Za-z0-9_-]+|\[[0-9]+\])*$")
PATH_PART = re.compile(r"\.?([A-Za-z0-9_-]+)|\[([0-9]+)\]")

# What a tool call's status may be required to be (runs.models.ToolCall.Status).
CALL_STATUSES = (
    "pending", "waiting_approval", "approved", "executing", "succeeded", "failed",
    "refused", "denied", "unknown", "cancelled",
)  # fmt: skip
WORLD_OBJECTS = ("replacements", "refunds")
DECISIONS = ("approve", "deny", "edit")

SUITE_KEYS = ("slug", "name", "description", "agent", "cases")
CASE_KEYS = ("slug", "input", "world", "approvals", "graders")
APPROVAL_KEYS = ("tool", "decision", "reason", "args")


class DefinitionError(ValueError):
    """A suite, case or grader the API refuses: `fields` maps each path to what
    is wrong there."""

    def __init__(self, fields: Mapping[str, list[str]]) -> None:
        self.fields = dict(fields)
        first = next(iter(self.fields.items()), ("", [""]))
        super().__init__(f"{first[0]}: {first[1][0]}")


@dataclass
class Problems:
    """Errors collected by path while a document is checked."""

    found: dict[str, list[str]] = field(default_factory=dict)

    def add(self, path: str, message: str) -> None:
        self.found.setdefault(path or "$", []).append(message)

    def raise_any(self) -> None:
        if self.found:
            raise DefinitionError(self.found)


def at(base: str, key: str | int) -> str:
    """The path of `key` below `base`: `cases[2]`, `cases[2].graders`."""
    if isinstance(key, int):
        return f"{base}[{key}]"
    return f"{base}.{key}" if base else key


def path_parts(path: str) -> list[str | int]:
    """`$.items[0].sku` as ["items", 0, "sku"]; raises ValueError if malformed."""
    if not PATH.match(path):
        raise ValueError(
            f"{path!r} is not a path like $.order_id or items[0].sku (keys and "
            "list indices only)"
        )
    body = path[1:] if path.startswith("$") else path
    return [int(index) if index else key for key, index in PATH_PART.findall(body)]


def _unknown_keys(
    value: Mapping[str, Any], allowed: tuple[str, ...], path: str, problems: Problems
) -> None:
    for key in value:
        if key not in allowed:
            problems.add(
                at(path, str(key)), f"unknown key; allowed: {', '.join(allowed)}"
            )


def _object(value: Any, path: str, problems: Problems) -> Mapping[str, Any] | None:
    if isinstance(value, Mapping):
        return value
    problems.add(path, "must be a mapping (an object)")
    return None


def _text(
    data: Mapping[str, Any],
    key: str,
    path: str,
    problems: Problems,
    *,
    required: bool = True,
    limit: int = MAX_TEXT_CHARS,
    pattern: re.Pattern[str] | None = None,
    blank: bool = False,
) -> None:
    if key not in data:
        if required:
            problems.add(at(path, key), "is required")
        return
    value = data[key]
    where = at(path, key)
    if not isinstance(value, str):
        problems.add(where, "must be a string")
    elif not blank and not value.strip():
        problems.add(where, "may not be blank")
    elif len(value) > limit:
        problems.add(where, f"is longer than {limit} characters")
    elif pattern is not None and value and not pattern.match(value):
        problems.add(where, f"must match {pattern.pattern}")


def _flag(data: Mapping[str, Any], key: str, path: str, problems: Problems) -> None:
    if key in data and not isinstance(data[key], bool):
        problems.add(at(path, key), "must be true or false")


def _json_path(
    data: Mapping[str, Any], key: str, path: str, problems: Problems
) -> None:
    _text(data, key, path, problems)
    value = data.get(key)
    if isinstance(value, str):
        try:
            path_parts(value)
        except ValueError as bad:
            problems.add(at(path, key), str(bad))


def _one_of(
    data: Mapping[str, Any], keys: tuple[str, ...], path: str, problems: Problems
) -> None:
    present = [key for key in keys if key in data]
    if len(present) != 1:
        problems.add(path, f"needs exactly one of: {', '.join(keys)}")


def _call_match(data: Mapping[str, Any], path: str, problems: Problems) -> None:
    _text(data, "tool", path, problems, limit=200)
    if "args" in data:
        _object(data["args"], at(path, "args"), problems)
    if "status" in data and data["status"] not in CALL_STATUSES:
        problems.add(at(path, "status"), f"must be one of: {', '.join(CALL_STATUSES)}")


def _args_check(data: Mapping[str, Any], path: str, problems: Problems) -> None:
    _text(data, "tool", path, problems, limit=200)
    if "path" in data:
        _json_path(data, "path", path, problems)
    _one_of(data, ("equals", "schema"), path, problems)
    schema = data.get("schema")
    if "schema" in data:
        if not isinstance(schema, Mapping):
            problems.add(at(path, "schema"), "must be a JSON Schema object")
        else:
            try:
                Draft202012Validator.check_schema(schema)
            except SchemaError as bad:
                problems.add(at(path, "schema"), f"invalid JSON Schema: {bad.message}")


def _answer_regex(data: Mapping[str, Any], path: str, problems: Problems) -> None:
    _text(data, "pattern", path, problems, limit=2000)
    _flag(data, "ignore_case", path, problems)
    _flag(data, "absent", path, problems)
    pattern = data.get("pattern")
    if isinstance(pattern, str):
        try:
            re.compile(pattern)
        except re.error as bad:
            problems.add(at(path, "pattern"), f"not a regular expression: {bad}")


def _answer_json(data: Mapping[str, Any], path: str, problems: Problems) -> None:
    _json_path(data, "path", path, problems)
    _one_of(data, ("equals", "contains"), path, problems)


def _world_state(data: Mapping[str, Any], path: str, problems: Problems) -> None:
    if data.get("object") not in WORLD_OBJECTS:
        problems.add(at(path, "object"), f"must be one of: {', '.join(WORLD_OBJECTS)}")
    _text(data, "order_id", path, problems, pattern=ORDER_ID)
    count = data.get("count")
    if "count" not in data:
        problems.add(at(path, "count"), "is required")
    elif isinstance(count, bool) or not isinstance(count, int) or count < 0:
        problems.add(at(path, "count"), "must be a whole number, 0 or more")


def _llm_judge(data: Mapping[str, Any], path: str, problems: Problems) -> None:
    _text(data, "rubric", path, problems)
    _text(data, "endpoint", path, problems, pattern=SLUG)
    _text(data, "model", path, problems, limit=200)


@dataclass(frozen=True)
class GraderKind:
    keys: tuple[str, ...]  # besides "kind"
    check: Callable[[Mapping[str, Any], str, Problems], None]
    tool_key: bool = True  # names a tool of the agent


GRADER_KINDS: dict[str, GraderKind] = {
    "must_call": GraderKind(("tool", "args", "status"), _call_match),
    "must_not_call": GraderKind(("tool", "args", "status"), _call_match),
    "args": GraderKind(("tool", "path", "equals", "schema"), _args_check),
    "final_answer_regex": GraderKind(
        ("pattern", "ignore_case", "absent"), _answer_regex, tool_key=False
    ),
    "final_answer_json": GraderKind(
        ("path", "equals", "contains"), _answer_json, tool_key=False
    ),
    "world_state": GraderKind(
        ("object", "order_id", "count"), _world_state, tool_key=False
    ),
    "llm_judge": GraderKind(
        ("rubric", "endpoint", "model"), _llm_judge, tool_key=False
    ),
}


def check_grader(value: Any, path: str, problems: Problems) -> None:
    data = _object(value, path, problems)
    if data is None:
        return
    kind = data.get("kind")
    spec = GRADER_KINDS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        problems.add(
            at(path, "kind"),
            f"unknown grader kind {kind!r}; known: {', '.join(GRADER_KINDS)}",
        )
        return
    _unknown_keys(data, ("kind", *spec.keys), path, problems)
    spec.check(data, path, problems)


def _check_approval(value: Any, path: str, problems: Problems) -> None:
    data = _object(value, path, problems)
    if data is None:
        return
    _unknown_keys(data, APPROVAL_KEYS, path, problems)
    _text(data, "tool", path, problems, limit=200)
    decision = data.get("decision")
    if decision not in DECISIONS:
        problems.add(at(path, "decision"), f"must be one of: {', '.join(DECISIONS)}")
    _text(data, "reason", path, problems, required=False, blank=True)
    if decision == "edit":
        if "args" not in data:
            problems.add(at(path, "args"), "is required for an edit")
        else:
            _object(data["args"], at(path, "args"), problems)
    elif "args" in data:
        problems.add(at(path, "args"), "only an edit carries arguments")


ORDER_KEYS = ("order_id", "customer", "item", "amount", "status", "damaged",
              "delivered_days_ago", "note")  # fmt: skip


def _check_order(value: Any, path: str, problems: Problems) -> None:
    data = _object(value, path, problems)
    if data is None:
        return
    _unknown_keys(data, ORDER_KEYS, path, problems)
    _text(data, "order_id", path, problems, pattern=ORDER_ID)
    _text(data, "customer", path, problems, limit=200)
    _text(data, "item", path, problems, limit=200)
    _text(data, "status", path, problems, required=False, limit=32)
    _text(data, "note", path, problems, required=False, blank=True, limit=2000)
    _flag(data, "damaged", path, problems)
    amount = data.get("amount")
    if "amount" not in data:
        problems.add(at(path, "amount"), "is required")
    else:
        try:
            ok = not isinstance(amount, bool) and 0 <= Decimal(str(amount)) < 10**8
        except InvalidOperation:
            ok = False
        if not ok:
            problems.add(at(path, "amount"), "must be a number from 0 to 99999999.99")
    days = data.get("delivered_days_ago")
    if "delivered_days_ago" in data and (
        isinstance(days, bool) or not isinstance(days, int) or not 0 <= days <= 3650
    ):
        problems.add(at(path, "delivered_days_ago"), "must be a whole number 0..3650")


def _check_world(value: Any, path: str, problems: Problems) -> None:
    data = _object(value, path, problems)
    if data is None:
        return
    _unknown_keys(data, ("orders",), path, problems)
    orders = data.get("orders", [])
    where = at(path, "orders")
    if not isinstance(orders, list):
        problems.add(where, "must be a list")
        return
    if len(orders) > MAX_ORDERS:
        problems.add(where, f"at most {MAX_ORDERS} orders")
    seen: set[str] = set()
    for i, order in enumerate(orders):
        _check_order(order, at(where, i), problems)
        order_id = order.get("order_id") if isinstance(order, Mapping) else None
        if isinstance(order_id, str):
            if order_id in seen:
                problems.add(at(at(where, i), "order_id"), "appears twice")
            seen.add(order_id)


def _check_list(
    data: Mapping[str, Any],
    key: str,
    path: str,
    problems: Problems,
    *,
    each: Callable[[Any, str, Problems], None],
    limit: int,
    required: bool,
) -> None:
    where = at(path, key)
    if key not in data:
        if required:
            problems.add(where, "is required")
        return
    items = data[key]
    if not isinstance(items, list):
        problems.add(where, "must be a list")
        return
    if required and not items:
        problems.add(where, "needs at least one entry")
    if len(items) > limit:
        problems.add(where, f"at most {limit} entries")
        return
    for i, item in enumerate(items):
        each(item, at(where, i), problems)


def check_case(value: Any, path: str, problems: Problems) -> None:
    """A case's definition (its keys are CASE_KEYS)."""
    data = _object(value, path, problems)
    if data is None:
        return
    _unknown_keys(data, CASE_KEYS, path, problems)
    _text(data, "slug", path, problems, pattern=SLUG)
    _text(data, "input", path, problems, limit=MAX_INPUT_CHARS)
    if "world" in data:
        _check_world(data["world"], at(path, "world"), problems)
    _check_list(data, "graders", path, problems, each=check_grader,
                limit=MAX_GRADERS, required=True)  # fmt: skip
    _check_list(data, "approvals", path, problems, each=_check_approval,
                limit=MAX_APPROVALS, required=False)  # fmt: skip
    approvals = data.get("approvals")
    if isinstance(approvals, list):
        seen: set[str] = set()
        for i, approval in enumerate(approvals):
            tool = approval.get("tool") if isinstance(approval, Mapping) else None
            if isinstance(tool, str):
                if tool in seen:
                    problems.add(
                        at(at(at(path, "approvals"), i), "tool"),
                        "has a decision already (one per tool)",
                    )
                seen.add(tool)


def case_validate(value: Any) -> dict[str, Any]:
    """A case definition, checked; raises DefinitionError naming each problem."""
    problems = Problems()
    check_case(value, "", problems)
    problems.raise_any()
    return case_normalised(value)


def case_normalised(data: Mapping[str, Any]) -> dict[str, Any]:
    """A checked case with every key present, in the export's order."""
    return {
        "slug": data["slug"],
        "input": data["input"],
        "world": dict(data.get("world") or {}),
        "approvals": [dict(a) for a in data.get("approvals") or []],
        "graders": [dict(g) for g in data["graders"]],
    }


def suite_validate(value: Any) -> dict[str, Any]:
    """A whole suite document (the YAML file's shape), checked; raises
    DefinitionError naming each problem, e.g. `cases[2].graders[0].tol`."""
    problems = Problems()
    data = _object(value, "", problems)
    if data is None:
        problems.raise_any()
        raise AssertionError  # unreachable: a non-mapping is a problem
    _unknown_keys(data, SUITE_KEYS, "", problems)
    _text(data, "slug", "", problems, pattern=SLUG)
    _text(data, "name", "", problems, limit=200)
    _text(data, "description", "", problems, required=False, blank=True)
    _text(data, "agent", "", problems, required=False, pattern=SLUG, blank=True)
    _check_list(data, "cases", "", problems, each=check_case,
                limit=MAX_CASES, required=True)  # fmt: skip
    cases = data.get("cases")
    if isinstance(cases, list):
        seen: set[str] = set()
        for i, case in enumerate(cases):
            slug = case.get("slug") if isinstance(case, Mapping) else None
            if isinstance(slug, str):
                if slug in seen:
                    problems.add(at(at("cases", i), "slug"), "appears twice")
                seen.add(slug)
    problems.raise_any()
    return {
        "slug": data["slug"],
        "name": data["name"],
        "description": data.get("description", ""),
        "agent": data.get("agent", ""),
        "cases": [case_normalised(case) for case in data["cases"]],
    }


def grader_tools(graders: list[Mapping[str, Any]]) -> set[str]:
    """The tools a case's graders name."""
    return {
        str(grader["tool"])
        for grader in graders
        if GRADER_KINDS[str(grader["kind"])].tool_key and "tool" in grader
    }
