"""One vocabulary for ingested spans: OpenInference and Traceloop attribute names
become the GenAI (gen_ai.*) ones the rest of the control plane reads; what one
span adds to its run's usage (`SpanUsage`) and what a trace's spans say about
the whole (`TraceSummary`)."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from tracing.ingest.openinference import openinference_llm_attributes

__all__ = [
    "SpanUsage",
    "TraceSummary",
    "map_attributes",
    "output_finish_reasons",
    "usage_of",
]

_OPENINFERENCE_OPERATIONS = {
    "LLM": "chat", "TOOL": "execute_tool", "AGENT": "invoke_agent",
    "EMBEDDING": "embeddings", "RETRIEVER": "retrieval",
}  # fmt: skip
_TRACELOOP_OPERATIONS = {"agent": "invoke_agent", "tool": "execute_tool",
                         "workflow": "invoke_agent"}  # fmt: skip
_SIMPLE_RENAMES = {
    # OpenInference (its models and messages: tracing.ingest.openinference)
    "llm.provider": "gen_ai.provider.name",
    "llm.system": "gen_ai.provider.name",
    "llm.token_count.prompt": "gen_ai.usage.input_tokens",
    "llm.token_count.completion": "gen_ai.usage.output_tokens",
    "tool.name": "gen_ai.tool.name",
    "tool_call.id": "gen_ai.tool.call.id",
    "agent.name": "gen_ai.agent.name",
    "session.id": "gen_ai.conversation.id",
    # Traceloop / OpenLLMetry and older GenAI names
    "gen_ai.system": "gen_ai.provider.name",
    "gen_ai.usage.prompt_tokens": "gen_ai.usage.input_tokens",
    "gen_ai.usage.completion_tokens": "gen_ai.usage.output_tokens",
    "llm.usage.prompt_tokens": "gen_ai.usage.input_tokens",
    "llm.usage.completion_tokens": "gen_ai.usage.output_tokens",
    "llm.request.model": "gen_ai.request.model",
    "llm.response.model": "gen_ai.response.model",
    # What a model call cost, as the sender priced it (ours is cp.*: the GenAI
    # conventions name no cost).
    "llm.cost.total": "cp.usage.cost",
    "gen_ai.usage.cost": "cp.usage.cost",
}
_INDEXED = re.compile(r"^gen_ai\.(prompt|completion)\.(\d+)\.(\w+)$")


def map_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """One vocabulary: OpenInference and Traceloop names become gen_ai.* ones.

    Names already in gen_ai.* win; the source names that carried payloads are
    folded into the payload keys, the rest are kept as they came.
    """
    out: dict[str, Any] = {}
    indexed: dict[str, dict[int, dict[str, Any]]] = {"prompt": {}, "completion": {}}
    for key, value in attributes.items():
        match = _INDEXED.match(key)
        if match:
            kind, index, field = match.group(1), int(match.group(2)), match.group(3)
            indexed[kind].setdefault(index, {})[field] = value
            continue
        out[key] = value
    for source, target in _SIMPLE_RENAMES.items():
        if source in attributes and target not in attributes:
            out.setdefault(target, attributes[source])
    if "openinference.span.kind" in attributes or "llm.model_name" in attributes:
        folded, consumed = openinference_llm_attributes(attributes)
        for key in consumed:
            out.pop(key, None)
        for key, value in folded.items():
            if key not in attributes:
                out.setdefault(key, value)
    operation = out.get("gen_ai.operation.name")
    oi_kind = str(attributes.get("openinference.span.kind") or "").upper()
    tl_kind = str(attributes.get("traceloop.span.kind") or "").lower()
    if not operation:
        operation = _OPENINFERENCE_OPERATIONS.get(oi_kind) or _TRACELOOP_OPERATIONS.get(
            tl_kind
        )
        if not operation and attributes.get("llm.request.type") == "chat":
            operation = "chat"
        if operation:
            out["gen_ai.operation.name"] = operation
    entity = attributes.get("traceloop.entity.name")
    if entity:
        if operation == "execute_tool":
            out.setdefault("gen_ai.tool.name", entity)
        elif operation == "invoke_agent":
            out.setdefault("gen_ai.agent.name", entity)
    # Inputs and outputs, whatever they were called.
    tool = operation == "execute_tool"
    source_input = attributes.get(
        "input.value", attributes.get("traceloop.entity.input")
    )
    source_output = attributes.get(
        "output.value", attributes.get("traceloop.entity.output")
    )
    input_key = "gen_ai.tool.call.arguments" if tool else "gen_ai.input.messages"
    output_key = "gen_ai.tool.call.result" if tool else "gen_ai.output.messages"
    if source_input is not None:
        out.setdefault(input_key, source_input)
    if source_output is not None:
        out.setdefault(output_key, source_output)
    if indexed["prompt"]:
        out.setdefault(
            "gen_ai.input.messages",
            [indexed["prompt"][i] for i in sorted(indexed["prompt"])],
        )
    if indexed["completion"]:
        completions = [indexed["completion"][i] for i in sorted(indexed["completion"])]
        out.setdefault("gen_ai.output.messages", completions)
        reasons = [c["finish_reason"] for c in completions if "finish_reason" in c]
        if reasons:
            out.setdefault("gen_ai.response.finish_reasons", reasons)
    if "gen_ai.response.finish_reasons" not in out:
        reasons = output_finish_reasons(out.get("gen_ai.output.messages"))
        if reasons:
            out["gen_ai.response.finish_reasons"] = reasons
    for source in ("input.value", "output.value", "traceloop.entity.input",
                   "traceloop.entity.output"):  # fmt: skip
        out.pop(source, None)
    return out


def output_finish_reasons(messages: Any) -> list[str]:
    """The finish reasons the GenAI conventions put on each output message, for
    a span that does not name them itself (openai-v2 leaves streamed calls'
    `gen_ai.response.finish_reasons` out but writes the messages')."""
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except ValueError:
            return []
    if not isinstance(messages, list | tuple):
        return []
    return [
        str(message["finish_reason"])
        for message in messages
        if isinstance(message, dict) and message.get("finish_reason")
    ]


# Operations that ask a model: one step of the agent each.
STEP_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
# Operations whose token counts are the run's (a model was called).
_MODEL_OPERATIONS = STEP_OPERATIONS | {"embeddings"}


@dataclass(frozen=True)
class SpanUsage:
    """What one span adds to its run: a step (a model call), a tool call, tokens,
    and the cost the sender reported (None: not priced by the sender)."""

    steps: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal | None = None
    model: str = ""  # the model that answered (else the one asked), for pricing


def _cost(value: Any) -> Decimal | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        cost = Decimal(str(value))
    except InvalidOperation:
        return None
    return cost if cost.is_finite() and 0 <= cost < Decimal(10) ** 8 else None


def usage_of(attributes: Mapping[str, Any]) -> SpanUsage:
    """A span's usage from its mapped attributes (checked token counts)."""
    operation = attributes.get("gen_ai.operation.name")
    if operation == "execute_tool":
        return SpanUsage(tool_calls=1)
    if operation not in _MODEL_OPERATIONS:
        return SpanUsage()
    model = attributes.get("gen_ai.response.model") or attributes.get(
        "gen_ai.request.model"
    )
    return SpanUsage(
        steps=int(operation in STEP_OPERATIONS),
        input_tokens=attributes.get("gen_ai.usage.input_tokens", 0),
        output_tokens=attributes.get("gen_ai.usage.output_tokens", 0),
        cost=_cost(attributes.get("cp.usage.cost")),
        model=model if isinstance(model, str) else "",
    )


@dataclass
class TraceSummary:
    """What a batch of a trace's spans says about the agent run it records: the
    usage its spans add (and, for spans sent again, the usage of the versions
    they replace: a re-sent span counts once), the root's outcome and
    messages, the last end."""

    added: list[SpanUsage] = field(default_factory=list)
    replaced: list[SpanUsage] = field(default_factory=list)
    failed: bool = False
    input: Any = None  # the root's gen_ai.input.messages, if it has them
    output: Any = None  # the root's gen_ai.output.messages
    finished_at: dt.datetime | None = None

    def add(
        self,
        *,
        root: bool,
        status: str,
        attributes: Mapping[str, Any],
        ended_at: dt.datetime | None,
        previous: Mapping[str, Any] | None = None,
    ) -> None:
        """Fold one span in (its attributes mapped and redacted; `previous`: the
        stored plain attributes of the version this one replaces)."""
        self.added.append(usage_of(attributes))
        if previous is not None:
            self.replaced.append(usage_of(previous))
        if root:
            self.failed = self.failed or status == "error"
            self.input = attributes.get("gen_ai.input.messages", self.input)
            self.output = attributes.get("gen_ai.output.messages", self.output)
        if ended_at is not None:
            self.finished_at = max(ended_at, self.finished_at or ended_at)

    def delta(self, name: str) -> int:
        """How much a counter moves (negative: a re-sent span says less)."""
        moved: int = sum(getattr(u, name) for u in self.added) - sum(
            getattr(u, name) for u in self.replaced
        )
        return moved
