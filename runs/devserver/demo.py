"""The script of the demo's OpenAI-compatible model (`seed_demo --with-mcp`).

`make run` serves it with `python -m runs.devserver --demo` on a loopback port and
the demo's second agent, "Kettlecraft warranty", reaches it through a model
endpoint of kind `openai`: the real streaming adapter, no API key. The model
looks the order up with a built-in tool and its warranty with the MCP tool of the
demo's stdio server (runs/mcp/servers/warranty.py, in the sandbox), then answers
from what the two tools returned (placeholders filled from the observations the
request carries, base.py `fill_placeholders`).
"""

from __future__ import annotations

from typing import Any

DEMO_MODEL = "kettlecraft-local"
# The model name the demo suite's `llm_judge` graders ask for: `--demo` answers
# it with the scripted judge (judge.py), not the script below.
DEMO_JUDGE_MODEL = "scripted-judge"
# The model-visible name of the MCP tool `mcp:warranty/warranty_lookup`
# (runs.mcp.endpoint.mcp_model_name; a test checks they agree).
WARRANTY_TOOL = "warranty_warranty_lookup"
DEMO_WARRANTY_INPUT = (
    "My copper kettle from order #4821 arrived with a dented spout. "
    "Is it still under warranty?"
)

DEMO_WARRANTY_SCRIPT: list[dict[str, Any]] = [
    {
        "text": "Let me look up the order and its warranty.",
        "tool_calls": [
            {"id": "call_order", "name": "lookup_order",
             "arguments": {"order_id": "4821"}},
            {"id": "call_warranty", "name": WARRANTY_TOOL,
             "arguments": {"order_id": "4821"}},
        ],
    },
    {
        "text": "I'm sorry about the damage. Order 4821 ({{call_order.item}}) is "
        "under warranty for {{call_warranty.structured.months_left}} more "
        "months, and damage in transit is covered: "
        "{{call_warranty.structured.covers_damage_in_transit}}. You can ask us "
        "for a free replacement.",
    },
]  # fmt: skip
