"""Align two runs step by step by meaning, not by position.

A run is a sequence of steps: one model call and the action it chose (tool
calls, a final answer, or an unusable reply). Two runs of an agent rarely line
up index for index: one retries a lookup, the other skips it. Steps are aligned
on their signature (the action's kind and the tools it named, arguments left
out) with a longest-matching-blocks alignment (difflib's), after trimming the
common head and tail so near-identical long runs cost one pass. Aligned steps
whose arguments, observations or answer text differ are "changed"; inside a
stretch that did not align, steps calling the same first tool are paired as
"changed" too, and what is left is "skipped" (only in the left run) or
"inserted" (only in the right run).

Pure Python: the Django side (runs/run_diff.py) builds the steps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from difflib import SequenceMatcher
from typing import Any, Literal

__all__ = [
    "Alignment",
    "ArgumentChange",
    "Divergence",
    "PairKind",
    "RunStep",
    "StepAction",
    "StepKind",
    "StepPair",
    "align_runs",
    "json_changes",
]

PairKind = Literal["same", "changed", "inserted", "skipped"]
StepKind = Literal["tool_calls", "final_answer", "invalid", "model_only"]
# A JSON diff longer than this is cut: the UI shows the first ones and a count.
MAX_ARGUMENT_CHANGES = 50


@dataclass(frozen=True)
class StepAction:
    """One tool call a step made and what came of it."""

    tool: str
    arguments: Any  # the decoded JSON arguments
    status: str  # succeeded | failed | denied | refused | ... (ok | error ingested)
    observation: str  # what the model read back, shortened by the reader


@dataclass(frozen=True)
class RunStep:
    """One model call and the action it chose."""

    index: int
    kind: StepKind
    calls: tuple[StepAction, ...] = ()
    text: str = ""  # the model's text (the answer, for a final answer)
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)
    latency_ms: float | None = None
    # The messages the model saw for the first time at this step (the user's
    # input, the previous step's tool results), each shortened.
    input_delta: tuple[str, ...] = ()

    @property
    def signature(self) -> tuple[str, tuple[str, ...]]:
        """What the step did, without how: aligned steps share it."""
        return (self.kind, tuple(call.tool for call in self.calls))

    @property
    def primary_tool(self) -> str:
        return self.calls[0].tool if self.calls else ""


@dataclass(frozen=True)
class ArgumentChange:
    """One difference between two JSON values, at a path like `items[0].sku`."""

    path: str
    op: Literal["added", "removed", "changed"]
    left: Any = None
    right: Any = None


@dataclass(frozen=True)
class StepPair:
    kind: PairKind
    left: RunStep | None
    right: RunStep | None
    reasons: tuple[str, ...] = ()
    argument_changes: tuple[tuple[ArgumentChange, ...], ...] = ()  # per call


@dataclass(frozen=True)
class Divergence:
    pair: int  # position in Alignment.pairs
    left_index: int | None  # the step's index in each run (None: absent there)
    right_index: int | None
    reason: str


@dataclass
class Alignment:
    pairs: list[StepPair] = field(default_factory=list)

    @property
    def first_divergence(self) -> Divergence | None:
        for position, pair in enumerate(self.pairs):
            if pair.kind != "same":
                return Divergence(
                    pair=position,
                    left_index=pair.left.index if pair.left else None,
                    right_index=pair.right.index if pair.right else None,
                    reason="; ".join(pair.reasons),
                )
        return None

    def count(self, kind: PairKind) -> int:
        return sum(1 for pair in self.pairs if pair.kind == kind)


def _path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def _walk(left: Any, right: Any, path: str) -> Iterator[ArgumentChange]:
    if isinstance(left, dict) and isinstance(right, dict):
        for key in left:
            if key not in right:
                yield ArgumentChange(_path(path, key), "removed", left=left[key])
            else:
                yield from _walk(left[key], right[key], _path(path, key))
        for key in right:
            if key not in left:
                yield ArgumentChange(_path(path, key), "added", right=right[key])
    elif isinstance(left, list) and isinstance(right, list):
        for position in range(max(len(left), len(right))):
            where = _path(path, position)
            if position >= len(right):
                yield ArgumentChange(where, "removed", left=left[position])
            elif position >= len(left):
                yield ArgumentChange(where, "added", right=right[position])
            else:
                yield from _walk(left[position], right[position], where)
    elif left != right or type(left) is not type(right):
        yield ArgumentChange(path or "$", "changed", left=left, right=right)


def json_changes(left: Any, right: Any) -> tuple[ArgumentChange, ...]:
    """The differences between two JSON values, key by key (at most
    MAX_ARGUMENT_CHANGES of them)."""
    found: list[ArgumentChange] = []
    for change in _walk(left, right, ""):
        found.append(change)
        if len(found) == MAX_ARGUMENT_CHANGES:
            break
    return tuple(found)


def _compare(left: RunStep, right: RunStep) -> StepPair:
    """Two steps aligned on their signature: same, or changed and why."""
    reasons: list[str] = []
    changes: list[tuple[ArgumentChange, ...]] = []
    if left.signature != right.signature:
        reasons.append(
            f"{_describe(left)} became {_describe(right)}"
            if left.kind == right.kind
            else f"{left.kind} became {right.kind}"
        )
    for position, (a, b) in enumerate(zip(left.calls, right.calls, strict=False)):
        delta = json_changes(a.arguments, b.arguments) if a.tool == b.tool else ()
        changes.append(delta)
        label = a.tool if len(left.calls) == 1 else f"{a.tool} (call {position + 1})"
        if delta:
            paths = ", ".join(change.path for change in delta[:3])
            more = f" and {len(delta) - 3} more" if len(delta) > 3 else ""
            reasons.append(f"{label} arguments differ ({paths}{more})")
        if a.status != b.status:
            reasons.append(f"{label} {a.status} here, {b.status} there")
        elif a.observation != b.observation:
            reasons.append(f"{label} observation differs")
    both_answer = left.kind == right.kind == "final_answer"
    if both_answer and left.text != right.text:
        reasons.append("final answer differs")
    if reasons:
        return StepPair("changed", left, right, tuple(reasons), tuple(changes))
    return StepPair("same", left, right, (), tuple(changes))


def _describe(step: RunStep) -> str:
    if step.kind == "tool_calls":
        return "+".join(call.tool for call in step.calls) or "no tool"
    return step.kind.replace("_", " ")


def _unmatched(left: Sequence[RunStep], right: Sequence[RunStep]) -> list[StepPair]:
    pairs = [
        StepPair("skipped", step, None, (f"{_describe(step)} only in the left run",))
        for step in left
    ]
    pairs += [
        StepPair("inserted", None, step, (f"{_describe(step)} only in the right run",))
        for step in right
    ]
    return pairs


def _refine(left: Sequence[RunStep], right: Sequence[RunStep]) -> list[StepPair]:
    """A stretch that did not align: steps that call the same first tool (or
    both answer) are paired as changed, in order; the rest stand alone."""
    keys_left = [(s.kind, s.primary_tool) for s in left]
    keys_right = [(s.kind, s.primary_tool) for s in right]
    matcher = SequenceMatcher(None, keys_left, keys_right, autojunk=False)
    pairs: list[StepPair] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            pairs += [
                _compare(a, b) for a, b in zip(left[i1:i2], right[j1:j2], strict=True)
            ]
        else:
            pairs += _unmatched(left[i1:i2], right[j1:j2])
    return pairs


def align_runs(left: Sequence[RunStep], right: Sequence[RunStep]) -> Alignment:
    """Pair the steps of two runs by what they did."""
    head = 0
    limit = min(len(left), len(right))
    while head < limit and left[head].signature == right[head].signature:
        head += 1
    tail = 0
    while (
        tail < limit - head
        and left[len(left) - 1 - tail].signature
        == right[len(right) - 1 - tail].signature
    ):
        tail += 1
    alignment = Alignment()
    pairs = alignment.pairs
    pairs += [_compare(a, b) for a, b in zip(left[:head], right[:head], strict=True)]
    middle_left = left[head : len(left) - tail]
    middle_right = right[head : len(right) - tail]
    matcher = SequenceMatcher(
        None,
        [s.signature for s in middle_left],
        [s.signature for s in middle_right],
        autojunk=False,
    )
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            pairs += [
                _compare(a, b)
                for a, b in zip(middle_left[i1:i2], middle_right[j1:j2], strict=True)
            ]
        elif op == "replace":
            pairs += _refine(middle_left[i1:i2], middle_right[j1:j2])
        else:
            pairs += _unmatched(middle_left[i1:i2], middle_right[j1:j2])
    pairs += [
        _compare(a, b)
        for a, b in zip(
            left[len(left) - tail :], right[len(right) - tail :], strict=True
        )
    ]
    return alignment
