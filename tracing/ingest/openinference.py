"""OpenInference's flattened LLM attributes read as GenAI ones.

OpenInference (`openinference-instrumentation-*`) flattens a model call's
messages into indexed attributes (`llm.input_messages.0.message.role`,
`llm.output_messages.0.message.tool_calls.0.tool_call.function.name`, ...), its
tools into `llm.tools.N.tool.json_schema`, and names one model in
`llm.model_name`: the request's until the provider answers, then the one the
provider reports (the request's stays in `llm.invocation_parameters`). This
module rebuilds the messages in the GenAI semantic conventions' shape
(`{"role", "parts": [...], "finish_reason"?}`) and tells the two models apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["openinference_llm_attributes"]

_MESSAGES = re.compile(r"^llm\.(input|output)_messages\.(\d+)\.message\.(.+)$")
_TOOLS = re.compile(r"^llm\.tools\.(\d+)\.tool\.(\w+)$")
_TOOL_CALL = re.compile(r"^tool_calls\.(\d+)\.tool_call\.(.+)$")
_CONTENT = re.compile(r"^contents\.(\d+)\.message_content\.(.+)$")
# What the model answered with: a span holding any of these saw a response.
_RESPONSE_KEYS = ("llm.token_count.completion", "llm.finish_reason", "output.value")


def _json_or_text(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _message(fields: Mapping[str, Any]) -> dict[str, Any]:
    """One flattened OpenInference message as a GenAI semconv message."""
    parts: list[dict[str, Any]] = []
    calls: dict[int, dict[str, Any]] = {}
    contents: dict[int, dict[str, Any]] = {}
    for key, value in fields.items():
        call = _TOOL_CALL.match(key)
        if call:
            calls.setdefault(int(call.group(1)), {})[call.group(2)] = value
            continue
        content = _CONTENT.match(key)
        if content:
            contents.setdefault(int(content.group(1)), {})[content.group(2)] = value
    if fields.get("tool_call_id") is not None:
        parts.append(
            {
                "type": "tool_call_response",
                "id": fields["tool_call_id"],
                "response": fields.get("content"),
            }
        )
    elif fields.get("content") is not None:
        parts.append({"type": "text", "content": fields["content"]})
    for index in sorted(contents):
        item = contents[index]
        if item.get("type", "text") == "text" and "text" in item:
            parts.append({"type": "text", "content": item["text"]})
        else:
            parts.append({"type": str(item.get("type") or "content"), **item})
    for index in sorted(calls):
        item = calls[index]
        parts.append(
            {
                "type": "tool_call",
                "id": item.get("id"),
                "name": item.get("function.name"),
                "arguments": _json_or_text(item.get("function.arguments")),
            }
        )
    if fields.get("function_call_name"):
        parts.append(
            {
                "type": "tool_call",
                "name": fields["function_call_name"],
                "arguments": _json_or_text(fields.get("function_call_arguments_json")),
            }
        )
    message: dict[str, Any] = {"role": fields.get("role") or "assistant"}
    if fields.get("name"):
        message["name"] = fields["name"]
    message["parts"] = parts
    return message


def _finish_reasons(attributes: Mapping[str, Any]) -> list[str]:
    """`llm.finish_reason`, else the choices of an LLM span's raw response
    (`output.value`, OpenAI's JSON), which older instrumentations leave as the
    only record."""
    reason = attributes.get("llm.finish_reason")
    if isinstance(reason, str) and reason:
        return [reason]
    if isinstance(reason, list | tuple):
        return [str(r) for r in reason if r]
    if str(attributes.get("openinference.span.kind") or "").upper() != "LLM":
        return []
    response = _json_or_text(attributes.get("output.value"))
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list):
        return [
            str(choice["finish_reason"])
            for choice in choices
            if isinstance(choice, dict) and choice.get("finish_reason")
        ]
    return []


def _request_model(attributes: Mapping[str, Any]) -> Any:
    requested = attributes.get("llm.request.model_name")
    if requested:
        return requested
    parameters = _json_or_text(attributes.get("llm.invocation_parameters"))
    if isinstance(parameters, dict) and isinstance(parameters.get("model"), str):
        return parameters["model"]
    return None


def openinference_llm_attributes(
    attributes: Mapping[str, Any],
) -> tuple[dict[str, Any], set[str]]:
    """The GenAI attributes an OpenInference span's LLM attributes say, and the
    source keys they were folded from (not kept as plain attributes: message
    content belongs in payloads)."""
    out: dict[str, Any] = {}
    consumed: set[str] = set()
    messages: dict[str, dict[int, dict[str, Any]]] = {"input": {}, "output": {}}
    tools: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if not key.startswith("llm."):
            continue
        match = _MESSAGES.match(key)
        if match:
            side, index, field = match.group(1), int(match.group(2)), match.group(3)
            messages[side].setdefault(index, {})[field] = value
            consumed.add(key)
            continue
        tool = _TOOLS.match(key)
        if tool:
            tools.setdefault(int(tool.group(1)), {})[tool.group(2)] = value
            consumed.add(key)

    model = attributes.get("llm.model_name")
    requested = _request_model(attributes)
    answered = attributes.get("llm.response.model_name")
    if (
        not answered
        and model
        and (messages["output"] or any(k in attributes for k in _RESPONSE_KEYS))
    ):
        # Once the provider answered, llm.model_name is the model it reported.
        answered = model
    if requested or model:
        out["gen_ai.request.model"] = requested or model
    if answered:
        out["gen_ai.response.model"] = answered

    reasons = _finish_reasons(attributes)
    if reasons:
        out["gen_ai.response.finish_reasons"] = reasons
    if messages["input"]:
        out["gen_ai.input.messages"] = [
            _message(messages["input"][i]) for i in sorted(messages["input"])
        ]
    if messages["output"]:
        output = [_message(messages["output"][i]) for i in sorted(messages["output"])]
        if len(reasons) == len(output):
            for message, reason in zip(output, reasons, strict=True):
                message["finish_reason"] = reason
        out["gen_ai.output.messages"] = output
    if tools:
        out["gen_ai.tool.definitions"] = [
            _json_or_text(tools[i].get("json_schema", tools[i])) for i in sorted(tools)
        ]
    return out, consumed
