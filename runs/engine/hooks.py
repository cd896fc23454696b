"""Hooks an agent version configures from a registry of built-in hook types
(spec §1.5): never arbitrary code.

Events, in the order a run meets them:

- `run_started`: the run's first step begins (lifecycle: may annotate; a
  failure blocks the run);
- `before_agent`: before the first model call, with the run's input (may add
  context for the model, or refuse the run);
- `tool_result`: every executed tool's result, before the model sees it (may
  redact, annotate, or stop the run); chained in order, each sees the last's;
- `run_finished`: the run ended (lifecycle: may annotate, or escalate a run
  that stopped on its budget to a person; too late to block).

Fail safe: a hook that raises, returns no effect, or outlasts its timeout
blocks (refuses the run, stops it, withholds the result) and never allows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from runs.engine.envelope import ErrorCode, ToolResult
from runs.engine.guarding import (
    ParamError,
    bool_param,
    compiled,
    patterns_param,
    run_timed,
    text_param,
    unknown_params,
)
from runs.engine.stop import BUDGET_STOP_REASONS

MAX_HOOKS = 20
DEFAULT_HOOK_TIMEOUT_SECONDS = 2.0
MAX_HOOK_TIMEOUT_SECONDS = 30.0
DEFAULT_REDACTION = "[redacted]"


class HookEvent(StrEnum):
    RUN_STARTED = "run_started"
    BEFORE_AGENT = "before_agent"
    TOOL_RESULT = "tool_result"
    RUN_FINISHED = "run_finished"


@dataclass(frozen=True)
class HookInput:
    """What a hook is shown: the run's input (before_agent), one tool's result
    (tool_result), or the run's outcome (run_finished)."""

    run_id: str
    agent: str = ""
    input: str = ""
    tool_name: str = ""
    result: ToolResult | None = None
    status: str = ""  # run_finished: the run's status and stop reason
    stop_reason: str = ""


@dataclass(frozen=True)
class HookEffect:
    """What a hook asks for; empty: nothing."""

    context: str = ""  # before_agent: text added for the model
    block: str = ""  # refuse the run (before_agent) or stop it (tool_result)
    result: ToolResult | None = None  # tool_result: the result as changed
    note: str = ""  # an annotation, shown on the hook's span
    # run_finished: hand the run to a person (flagged for review), answering
    # the customer with this when the run has no answer of its own.
    escalate: str = ""


Handler = Callable[[HookInput], HookEffect]


@dataclass(frozen=True)
class HookType:
    events: tuple[HookEvent, ...]
    description: str
    build: Callable[[Mapping[str, Any]], Handler]  # raises ParamError


def _tools_param(params: Mapping[str, Any]) -> frozenset[str]:
    value = params.get("tools", [])
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise ParamError("tools must be a list of tool names (empty: every tool)")
    return frozenset(value)


def _applies(tools: frozenset[str], hook_input: HookInput) -> bool:
    return not tools or hook_input.tool_name in tools


def _add_context(params: Mapping[str, Any]) -> Handler:
    unknown_params(params, ("text",))
    text = text_param(params, "text")
    return lambda _: HookEffect(context=text, note=f"added {len(text)} characters")


def _refuse_if_match(params: Mapping[str, Any]) -> Handler:
    unknown_params(params, ("patterns", "ignore_case", "message"))
    patterns = compiled(
        patterns_param(params), ignore_case=bool_param(params, "ignore_case", True)
    )
    message = text_param(
        params, "message", required=False, default="the input matches a refused pattern"
    )

    def handle(hook_input: HookInput) -> HookEffect:
        for pattern in patterns:
            if pattern.search(hook_input.input):
                return HookEffect(block=message, note=f"matched {pattern.pattern!r}")
        return HookEffect()

    return handle


def _rewrite_strings(value: Any, change: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return change(value)
    if isinstance(value, list):
        return [_rewrite_strings(item, change) for item in value]
    if isinstance(value, dict):
        return {key: _rewrite_strings(item, change) for key, item in value.items()}
    return value


def _redact(params: Mapping[str, Any]) -> Handler:
    unknown_params(params, ("patterns", "ignore_case", "replacement", "tools"))
    patterns = compiled(
        patterns_param(params), ignore_case=bool_param(params, "ignore_case", False)
    )
    replacement = text_param(
        params, "replacement", required=False, default=DEFAULT_REDACTION, limit=100
    )
    tools = _tools_param(params)

    def handle(hook_input: HookInput) -> HookEffect:
        result = hook_input.result
        if result is None or not _applies(tools, hook_input):
            return HookEffect()
        count = 0

        def change(text: str) -> str:
            nonlocal count
            for pattern in patterns:
                text, n = pattern.subn(replacement, text)
                count += n
            return text

        data = _rewrite_strings(result.data, change)
        error = result.error
        if error is not None:
            error = dataclasses.replace(error, message=change(error.message))
        if not count:
            return HookEffect()
        changed = dataclasses.replace(result, data=data, error=error)
        return HookEffect(result=changed, note=f"redacted {count} match(es)")

    return handle


def _annotate(params: Mapping[str, Any]) -> Handler:
    unknown_params(params, ("text", "tools"))
    text = text_param(params, "text", limit=2000)
    tools = _tools_param(params)

    def handle(hook_input: HookInput) -> HookEffect:
        result = hook_input.result
        if result is None or not _applies(tools, hook_input):
            return HookEffect()
        data = result.data
        noted = (
            {**data, "host_note": text}
            if isinstance(data, dict)
            else {"value": data, "host_note": text}
        )
        return HookEffect(result=dataclasses.replace(result, data=noted), note=text)

    return handle


def _stop_if_match(params: Mapping[str, Any]) -> Handler:
    unknown_params(params, ("patterns", "ignore_case", "reason", "tools"))
    patterns = compiled(
        patterns_param(params), ignore_case=bool_param(params, "ignore_case", True)
    )
    reason = text_param(
        params, "reason", required=False,
        default="a tool result matched a pattern that stops the run",
    )  # fmt: skip
    tools = _tools_param(params)

    def handle(hook_input: HookInput) -> HookEffect:
        result = hook_input.result
        if result is None or not _applies(tools, hook_input):
            return HookEffect()
        text = repr(result.data) + (result.error.message if result.error else "")
        for pattern in patterns:
            if pattern.search(text):
                return HookEffect(block=reason, note=f"matched {pattern.pattern!r}")
        return HookEffect()

    return handle


def _annotate_run(params: Mapping[str, Any]) -> Handler:
    unknown_params(params, ("text",))
    text = text_param(params, "text", limit=2000)
    return lambda _: HookEffect(note=text)


# The spec's harness answer when the budget runs out (spec §2.1 ch. 2).
DEFAULT_ESCALATION = "This is taking longer than expected. A teammate will follow up."
_BUDGET_STOPS = sorted(str(reason) for reason in BUDGET_STOP_REASONS)


def _escalate(params: Mapping[str, Any]) -> Handler:
    unknown_params(params, ("message", "stop_reasons"))
    message = text_param(
        params, "message", required=False, default=DEFAULT_ESCALATION, limit=2000
    )
    reasons = params.get("stop_reasons", _BUDGET_STOPS)
    if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
        raise ParamError("stop_reasons must be a list of stop reasons")

    def handle(hook_input: HookInput) -> HookEffect:
        if hook_input.stop_reason not in reasons:
            return HookEffect()
        return HookEffect(
            escalate=message, note=f"escalated: stopped {hook_input.stop_reason}"
        )

    return handle


HOOK_TYPES: dict[str, HookType] = {
    "add_context": HookType(
        (HookEvent.BEFORE_AGENT,),
        "Adds `text` to the model's context before its first call.",
        _add_context,
    ),
    "refuse_if_match": HookType(
        (HookEvent.BEFORE_AGENT,),
        "Refuses the run (`message`) when its input matches one of `patterns`.",
        _refuse_if_match,
    ),
    "redact": HookType(
        (HookEvent.TOOL_RESULT,),
        "Replaces each match of `patterns` in a tool result with `replacement` "
        "(default [redacted]) before the model sees it; `tools` limits it.",
        _redact,
    ),
    "annotate": HookType(
        (HookEvent.TOOL_RESULT,),
        "Adds `text` to a tool result as `host_note`; `tools` limits it.",
        _annotate,
    ),
    "stop_if_match": HookType(
        (HookEvent.TOOL_RESULT,),
        "Stops the run (`reason`) when a tool result matches one of `patterns`.",
        _stop_if_match,
    ),
    "annotate_run": HookType(
        (HookEvent.RUN_STARTED, HookEvent.RUN_FINISHED),
        "Records `text` as an annotation span when the run starts or finishes.",
        _annotate_run,
    ),
    "escalate": HookType(
        (HookEvent.RUN_FINISHED,),
        "When the run stopped for one of `stop_reasons` (default: its budget), "
        "flags it for a person and answers with `message` if it has no answer.",
        _escalate,
    ),
}


@dataclass(frozen=True)
class HookSpec:
    """One configured hook; `to_dict`-shaped like its configuration."""

    type: str
    event: HookEvent
    params: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""
    timeout_seconds: float = DEFAULT_HOOK_TIMEOUT_SECONDS

    @property
    def label(self) -> str:
        return self.name or self.type


_KEYS = ("type", "event", "params", "name", "timeout_seconds")


def hook_from_dict(data: Any, types: Mapping[str, HookType]) -> HookSpec:
    """A hook from its configuration; ParamError names what is wrong."""
    if not isinstance(data, dict):
        raise ParamError("must be an object")
    unknown_params(data, _KEYS)
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in types:
        raise ParamError(f"type: no hook type {kind!r}; known: {', '.join(types)}")
    hook_type = types[kind]
    event = data.get("event", str(hook_type.events[0]))
    if event not in [str(e) for e in hook_type.events]:
        raise ParamError(
            f"event: {kind} hooks run on {', '.join(map(str, hook_type.events))}, "
            f"not {event!r}"
        )
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise ParamError("params must be an object")
    try:
        hook_type.build(params)
    except ParamError as exc:
        raise ParamError(f"params.{exc}") from None
    name = data.get("name", "")
    if not isinstance(name, str) or len(name) > 64:
        raise ParamError("name must be a string of at most 64 characters")
    timeout = data.get("timeout_seconds", DEFAULT_HOOK_TIMEOUT_SECONDS)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_HOOK_TIMEOUT_SECONDS
    ):
        raise ParamError(
            "timeout_seconds must be a number above 0 and at most "
            f"{MAX_HOOK_TIMEOUT_SECONDS:g}"
        )
    return HookSpec(kind, HookEvent(event), params, name, float(timeout))


class HookStatus(StrEnum):
    OK = "ok"  # ran; its effect (maybe none) applies
    BLOCKED = "blocked"  # it asked to refuse or stop
    FAILED = "failed"  # raised, timed out or returned no effect: fail safe


@dataclass(frozen=True)
class HookOutcome:
    spec: HookSpec
    status: HookStatus
    effect: HookEffect
    detail: str
    latency_ms: float

    @property
    def stops(self) -> bool:
        """Whether the run must not go on as if nothing happened."""
        return self.status is not HookStatus.OK


def run_hook(
    spec: HookSpec, types: Mapping[str, HookType], hook_input: HookInput
) -> HookOutcome:
    """Run one hook under its timeout; any failure is `FAILED` (the caller blocks)."""
    try:
        handler = types[spec.type].build(spec.params)
    except Exception as exc:  # noqa: BLE001 - a type gone or changed: fail safe
        return HookOutcome(
            spec, HookStatus.FAILED, HookEffect(), f"hook could not be built: {exc}", 0
        )
    timed = run_timed(lambda: handler(hook_input), spec.timeout_seconds)
    if timed.error is not None:
        error = timed.error
        return HookOutcome(
            spec, HookStatus.FAILED, HookEffect(),
            f"hook {spec.label} failed ({type(error).__name__}: {error})",
            timed.latency_ms,
        )  # fmt: skip
    effect = timed.value
    if not isinstance(effect, HookEffect):
        return HookOutcome(
            spec, HookStatus.FAILED, HookEffect(),
            f"hook {spec.label} returned no effect", timed.latency_ms,
        )  # fmt: skip
    if effect.result is not None and not isinstance(effect.result, ToolResult):
        return HookOutcome(
            spec, HookStatus.FAILED, HookEffect(),
            f"hook {spec.label} returned a malformed result", timed.latency_ms,
        )  # fmt: skip
    if effect.block:
        return HookOutcome(
            spec, HookStatus.BLOCKED, effect, effect.block, timed.latency_ms
        )
    return HookOutcome(spec, HookStatus.OK, effect, effect.note, timed.latency_ms)


def withheld_result(tool_name: str, detail: str) -> ToolResult:
    """What stands for a result a failed hook kept from the model."""
    return ToolResult.failure(
        ErrorCode.EPERM,
        f"the result of {tool_name} was withheld: {detail}",
        retryable=False,
    )
