"""Graders read the trace (spec §2.5): each judges one finished run (hosted, or
external from its spans: runs.evals.calls) from its recorded tool calls, its
final answer, the demo shop's state after it, or an LLM judge's verdict, and
says (passed, reason). A case passes only if every grader passes; a grader that
could not judge is an error, never a pass.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from jsonschema import Draft202012Validator

from runs.evals.calls import GradedCall, run_graded_calls
from runs.evals.definitions import grader_tools, path_parts
from runs.evals.judge import JudgeUnavailable, judge_ask, judge_messages
from runs.mcp.endpoint import mcp_model_name
from runs.models import AgentVersion, ModelEndpoint, Run
from runs.tools.mcp import parse_mcp_ref
from shop.models import Refund, Replacement

__all__ = [
    "CaseVerdict",
    "GraderResult",
    "case_grade",
    "graders_check_against",
    "judge_endpoint_problems",
]

_MISSING = object()


@dataclass(frozen=True)
class GraderResult:
    kind: str
    passed: bool
    reason: str
    error: bool = False  # the grader could not judge (passed is then False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CaseVerdict:
    passed: bool  # every grader passed
    error: bool  # some grader could not judge
    results: tuple[GraderResult, ...]


@dataclass(frozen=True)
class Trace:
    """What graders read of a finished run."""

    run: Run
    calls: Sequence[GradedCall]


def _at(value: Any, path: str) -> Any:
    """The value at `path` in `value`, or _MISSING."""
    for part in path_parts(path):
        if isinstance(part, int):
            if not isinstance(value, list) or part >= len(value):
                return _MISSING
            value = value[part]
        else:
            if not isinstance(value, dict) or part not in value:
                return _MISSING
            value = value[part]
    return value


def _subset(expected: Any, actual: Any) -> bool:
    """`actual` has every key of `expected` with an equal value (recursively)."""
    if isinstance(expected, Mapping):
        return isinstance(actual, Mapping) and all(
            key in actual and _subset(value, actual[key])
            for key, value in expected.items()
        )
    return bool(expected == actual)


def _matching(trace: Trace, grader: Mapping[str, Any]) -> list[GradedCall]:
    return [
        call
        for call in trace.calls
        if call.tool_name == grader["tool"]
        and ("status" not in grader or call.status == grader["status"])
        and _subset(grader.get("args", {}), call.args)
    ]


def _describe(grader: Mapping[str, Any]) -> str:
    text = str(grader["tool"])
    if "args" in grader:
        text += f" with {json.dumps(grader['args'], sort_keys=True)}"
    if "status" in grader:
        text += f" ({grader['status']})"
    return text


def _must_call(trace: Trace, grader: Mapping[str, Any]) -> tuple[bool, str]:
    found = _matching(trace, grader)
    if found:
        return True, f"called {_describe(grader)} ({len(found)}x)"
    called = sorted({call.tool_name for call in trace.calls}) or ["no tool"]
    return False, f"never called {_describe(grader)}; called {', '.join(called)}"


def _must_not_call(trace: Trace, grader: Mapping[str, Any]) -> tuple[bool, str]:
    found = _matching(trace, grader)
    if found:
        first = found[0]
        return False, (
            f"called {_describe(grader)}: step {first.step_index}, "
            f"{json.dumps(first.args, sort_keys=True)} ({first.status})"
        )
    return True, f"did not call {_describe(grader)}"


def _args(trace: Trace, grader: Mapping[str, Any]) -> tuple[bool, str]:
    calls = [call for call in trace.calls if call.tool_name == grader["tool"]]
    if not calls:
        return False, f"{grader['tool']} was never called, so no arguments to check"
    path = str(grader.get("path", "$"))
    for n, call in enumerate(calls, start=1):
        value = _at(call.args, path)
        if value is _MISSING:
            return False, f"call {n} of {grader['tool']} has nothing at {path}"
        if "equals" in grader and value != grader["equals"]:
            return False, (
                f"call {n} of {grader['tool']}: {path} is {json.dumps(value)}, "
                f"expected {json.dumps(grader['equals'])}"
            )
        if "schema" in grader:
            errors = list(Draft202012Validator(grader["schema"]).iter_errors(value))
            if errors:
                where = "".join(f"[{p}]" for p in errors[0].absolute_path)
                return False, (
                    f"call {n} of {grader['tool']}: {path}{where} {errors[0].message}"
                )
    return True, f"every call of {grader['tool']} ({len(calls)}) has {path} as expected"


def _answer_regex(trace: Trace, grader: Mapping[str, Any]) -> tuple[bool, str]:
    flags = re.IGNORECASE if grader.get("ignore_case") else 0
    found = re.search(str(grader["pattern"]), trace.run.final_answer, flags)
    if grader.get("absent"):
        if found:
            return False, f"the final answer contains {found.group(0)!r}"
        return True, f"the final answer does not match /{grader['pattern']}/"
    if found:
        return True, f"the final answer contains {found.group(0)!r}"
    return False, f"the final answer does not match /{grader['pattern']}/"


def _answer_json(trace: Trace, grader: Mapping[str, Any]) -> tuple[bool, str]:
    try:
        document = json.loads(trace.run.final_answer)
    except ValueError:
        return False, "the final answer is not JSON"
    path = str(grader["path"])
    value = _at(document, path)
    if value is _MISSING:
        return False, f"the final answer has nothing at {path}"
    if "equals" in grader:
        if value == grader["equals"]:
            return True, f"{path} is {json.dumps(value)}"
        return False, (
            f"{path} is {json.dumps(value)}, expected {json.dumps(grader['equals'])}"
        )
    wanted = grader["contains"]
    if isinstance(value, str) and isinstance(wanted, str) or isinstance(value, list):
        held = wanted in value
    elif isinstance(value, dict):
        held = _subset(wanted, value)
    else:
        held = False
    shown = json.dumps(value)[:200]
    if held:
        return True, f"{path} contains {json.dumps(wanted)}"
    return False, f"{path} ({shown}) does not contain {json.dumps(wanted)}"


WORLD_ROWS: dict[str, type[Replacement] | type[Refund]] = {
    "replacements": Replacement,
    "refunds": Refund,
}


def _world_state(trace: Trace, grader: Mapping[str, Any]) -> tuple[bool, str]:
    """The shop rows of the order in the run's world. A trial with a world of its
    own started it fresh, so every row there is this run's effect; a run in the
    tenant's real shop counts the rows made while it lasted."""
    run = trace.run
    rows = WORLD_ROWS[str(grader["object"])].objects.filter(
        order__tenant_id=run.tenant_id,
        order__world_id=run.world_id,
        order__order_id=grader["order_id"],
    )
    if run.world_id is None:
        rows = rows.filter(created_at__gte=run.created_at)
        if run.finished_at is not None:
            rows = rows.filter(created_at__lte=run.finished_at)
    count = rows.count()
    what = f"{grader['object']} for order {grader['order_id']}"
    if count == grader["count"]:
        return True, f"{count} {what}, as expected"
    return False, f"{count} {what}, expected {grader['count']}"


def _llm_judge(trace: Trace, grader: Mapping[str, Any]) -> tuple[bool, str]:
    verdict = judge_ask(
        tenant_id=trace.run.tenant_id,
        endpoint_slug=str(grader["endpoint"]),
        model=str(grader["model"]),
        messages=judge_messages(
            rubric=str(grader["rubric"]), run=trace.run, calls=trace.calls
        ),
    )
    return verdict.passed, f"judge: {verdict.reason}"


GRADERS: dict[str, Callable[[Trace, Mapping[str, Any]], tuple[bool, str]]] = {
    "must_call": _must_call,
    "must_not_call": _must_not_call,
    "args": _args,
    "final_answer_regex": _answer_regex,
    "final_answer_json": _answer_json,
    "world_state": _world_state,
    "llm_judge": _llm_judge,
}


def case_grade(*, run: Run, graders: Sequence[Mapping[str, Any]]) -> CaseVerdict:
    """Judge a finished run by every grader (checked definitions,
    runs.evals.definitions); all are asked, so the report shows each reason."""
    trace = Trace(run=run, calls=run_graded_calls(run))
    results = []
    for grader in graders:
        kind = str(grader["kind"])
        try:
            passed, reason = GRADERS[kind](trace, grader)
        except JudgeUnavailable as unavailable:
            results.append(GraderResult(kind, False, str(unavailable), error=True))
            continue
        results.append(GraderResult(kind, passed, reason))
    return CaseVerdict(
        passed=all(r.passed for r in results),
        error=any(r.error for r in results),
        results=tuple(results),
    )


def agent_tool_names(version: AgentVersion) -> set[str]:
    """The names the version's model calls its tools by."""
    names = set()
    for ref in version.tools:
        parsed = parse_mcp_ref(str(ref))
        names.add(mcp_model_name(*parsed) if parsed else str(ref))
    return names


def graders_check_against(
    version: AgentVersion, cases: Sequence[Mapping[str, Any]]
) -> dict[str, list[str]]:
    """What keeps these (checked) cases from running against `version`, by
    path: a grader or a scripted approval naming a tool the agent lacks, a
    judge endpoint the tenant does not have or that cannot judge. Empty: none."""
    tools = agent_tool_names(version)
    problems = judge_endpoint_problems(version.agent.tenant_id, cases)
    lacks = f"agent {version.agent.slug} v{version.number} has no tool"
    for i, case in enumerate(cases):
        for j, grader in enumerate(case["graders"]):
            if grader_tools([grader]) - tools:
                problems[f"cases[{i}].graders[{j}].tool"] = [
                    f"{lacks} {grader['tool']!r}"
                ]
        for j, approval in enumerate(case.get("approvals") or ()):
            if approval["tool"] not in tools:
                problems[f"cases[{i}].approvals[{j}].tool"] = [
                    f"{lacks} {approval['tool']!r}"
                ]
    return problems


def judge_endpoint_problems(
    tenant_id: Any, cases: Sequence[Mapping[str, Any]]
) -> dict[str, list[str]]:
    """LLM judges naming an endpoint the tenant lacks or one that cannot judge
    (a scripted one), by path."""
    endpoints = dict(
        ModelEndpoint.objects.filter(tenant_id=tenant_id).values_list("slug", "kind")
    )
    problems: dict[str, list[str]] = {}
    for i, case in enumerate(cases):
        for j, grader in enumerate(case["graders"]):
            if grader["kind"] != "llm_judge":
                continue
            where = f"cases[{i}].graders[{j}].endpoint"
            kind = endpoints.get(grader["endpoint"])
            if kind is None:
                problems[where] = [
                    f"no model endpoint {grader['endpoint']!r} in this tenant"
                ]
            elif kind == ModelEndpoint.Kind.SCRIPTED:
                problems[where] = [
                    f"model endpoint {grader['endpoint']!r} is scripted; a "
                    "judge needs a model that reads the rubric"
                ]
    return problems
