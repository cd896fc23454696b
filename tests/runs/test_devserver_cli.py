"""`python -m runs.devserver`: the scripted OpenAI-compatible server the demo runs,
answered by the real adapter (each reply chosen by the conversation's turn)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from controlplane.embedded_redis import free_local_port
from runs.engine.adapters import build_model_adapter
from tests.conftest import BASE_DIR


def test_the_cli_serves_a_script_over_chat_completions(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                {
                    "tool_calls": [
                        {"name": "lookup_order", "arguments": {"order_id": "4821"}}
                    ]
                },
                {"text": "Order 4821 ships Thursday."},
            ]
        )
    )
    port = free_local_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "runs.devserver", "--protocol", "openai",
         "--port", str(port), "--script", str(script), "--chunk-delay", "0"],
        cwd=BASE_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            except urllib.error.HTTPError:
                break  # it answers (501 to a GET)
            except OSError:
                time.sleep(0.1)
        model = build_model_adapter(
            "openai",
            model="scripted-demo",
            api_key="no-key",
            base_url=f"http://127.0.0.1:{port}/v1",
            options={"stream": True},
        )
        messages = [{"role": "user", "content": "Where is 4821?"}]
        first = model.complete(messages, [], 100, on_delta=lambda text: None)
        assert first.tool_calls[0].name == "lookup_order"
        assert first.tool_calls[0].arguments == {"order_id": "4821"}
        assert first.usage.input_tokens > 0
        call = first.tool_calls[0]
        messages += [
            {"role": "assistant", "content": None,
             "tool_calls": [call.to_message_dict()]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "{}"},
        ]  # fmt: skip
        second = model.complete(messages, [], 100)
        assert second.text == "Order 4821 ships Thursday."
    finally:
        server.terminate()
        server.wait(10)
    assert b"openai model server on" in (server.stdout.read() if server.stdout else b"")
