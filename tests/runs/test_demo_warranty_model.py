"""The demo's local OpenAI-compatible model (`python -m runs.devserver --demo`):
its script calls the warranty MCP tool by its model-visible name, answers from
what the tools returned (as read from the request, through the real adapter), and
the demo's evaluator judges that answer from the recorded observations."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from controlplane.embedded_redis import free_local_port
from runs.demo_warranty import DEMO_MCP_SLUG, DEMO_MCP_TOOL
from runs.devserver import ChatCompletionsServer
from runs.devserver.base import fill_placeholders
from runs.devserver.demo import DEMO_WARRANTY_SCRIPT, WARRANTY_TOOL
from runs.engine.adapters import build_model_adapter
from runs.engine.evaluator import EvaluationSubject, Verdict
from runs.evaluators import WarrantyAnsweredEvaluator
from runs.mcp.endpoint import mcp_model_name
from tests.conftest import BASE_DIR

ORDER = {"order_id": "4821", "item": "Copper kettle, 1.7 l"}
WARRANTY = {
    "text": "{}",
    "structured": {"order_id": "4821", "item": "kettle", "months_left": 18,
                   "covers_damage_in_transit": True},
}  # fmt: skip


def observation(data: dict[str, Any], ok: bool = True) -> str:
    """A tool message's content as the host writes it (runs/engine/observation)."""
    return json.dumps({"trust": "tool_output_untrusted", "ok": ok, "data": data,
                       "error": None, "refs": []})  # fmt: skip


def test_the_script_names_the_mcp_tool_as_the_model_sees_it() -> None:
    assert mcp_model_name(DEMO_MCP_SLUG, DEMO_MCP_TOOL) == WARRANTY_TOOL
    assert WarrantyAnsweredEvaluator().tool_name == WARRANTY_TOOL


def test_the_answer_quotes_the_tools_through_the_real_streaming_adapter() -> None:
    with ChatCompletionsServer(script=DEMO_WARRANTY_SCRIPT) as server:
        model = build_model_adapter(
            "openai", model="kettlecraft-local", api_key="none",
            base_url=server.base_url, options={"stream": True},
        )  # fmt: skip
        messages: list[dict[str, Any]] = [{"role": "user", "content": "warranty?"}]
        first = model.complete(messages, [], 200, on_delta=lambda text: None)
        assert [(c.name, dict(c.arguments)) for c in first.tool_calls] == [
            ("lookup_order", {"order_id": "4821"}),
            (WARRANTY_TOOL, {"order_id": "4821"}),
        ]
        order, warranty = first.tool_calls
        messages += [
            {"role": "assistant", "content": first.text,
             "tool_calls": [c.to_message_dict() for c in first.tool_calls]},
            {"role": "tool", "tool_call_id": order.call_id,
             "content": observation(ORDER)},
            {"role": "tool", "tool_call_id": warranty.call_id,
             "content": observation(WARRANTY)},
        ]  # fmt: skip
        deltas: list[str] = []
        second = model.complete(messages, [], 200, on_delta=deltas.append)
    assert second.text is not None
    assert "Order 4821 (Copper kettle, 1.7 l) is under warranty" in second.text
    assert "18 more months" in second.text
    assert "damage in transit is covered: yes" in second.text
    assert len(deltas) > 1 and "".join(deltas) == second.text  # streamed
    verdict = WarrantyAnsweredEvaluator().evaluate(
        EvaluationSubject("r", "warranty?", second.text, messages)
    )
    assert verdict.verdict == Verdict.PASSED, verdict.reason
    wrong = second.text.replace("18 more", "24 more")
    verdict = WarrantyAnsweredEvaluator().evaluate(
        EvaluationSubject("r", "warranty?", wrong, messages)
    )
    assert verdict.verdict == Verdict.FAILED
    assert "'18 more months'" in verdict.reason


def test_placeholders_read_either_protocol_and_leave_the_unanswered_alone() -> None:
    anthropic_body = {
        "messages": [
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": observation(WARRANTY)}]},
            ]},
        ]
    }  # fmt: skip
    text = "{{toolu_1.structured.months_left}} / {{toolu_1.nothing}} / {{other.x}}"
    assert fill_placeholders(text, anthropic_body) == (
        "18 / {{toolu_1.nothing}} / {{other.x}}"
    )
    refused = {"ok": False, "data": None, "error": {"message": "no warranty"}}
    failed = {
        "messages": [
            {"role": "tool", "tool_call_id": "c", "content": json.dumps(refused)}
        ]
    }
    assert fill_placeholders("{{c.message}}", failed) == "no warranty"


def test_the_cli_serves_the_demo_script() -> None:
    port = free_local_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "runs.devserver", "--demo", "--port", str(port),
         "--chunk-delay", "0"],
        cwd=BASE_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        body = json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        ).encode()
        while True:
            try:
                with urllib.request.urlopen(
                    urllib.request.Request(
                        f"http://127.0.0.1:{port}/v1/chat/completions",
                        data=body,
                        headers={"content-type": "application/json"},
                    ),
                    timeout=2,
                ) as response:
                    reply = json.loads(response.read())
                break
            except (urllib.error.URLError, OSError):
                assert time.monotonic() < deadline, "the demo model never answered"
                time.sleep(0.1)
        calls = reply["choices"][0]["message"]["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["lookup_order", WARRANTY_TOOL]
    finally:
        server.terminate()
        server.wait(10)
