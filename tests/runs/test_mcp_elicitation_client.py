"""The MCP client's side of elicitation against a 2025-11-25 server that asks
mid-call (a server-to-client `elicitation/create`): with no recorded answer the
call stops unfinished with the server's message and schema; called again with
the answer, the server's request is accepted with it and the call completes.
(The 2026-07-28 `input_required` path: tests/runs/test_questions_mcp.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runs.mcp.client import mcp_call_tool, mcp_list_tools
from runs.mcp.endpoint import McpEndpoint, McpInputRequired

SERVER = Path(__file__).with_name("legacy_elicit_server.py")


class LocalProcess:
    """The server as a plain child process (the sandboxed launcher is tested
    elsewhere): its pipes, and a stop that reports nothing."""

    def __init__(self, log: Path) -> None:
        self.log = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin = self.process.stdin.fileno()
        self.stdout = self.process.stdout.fileno()

    def stop(self, grace_seconds: float = 1.0) -> str:
        self.process.kill()
        self.process.wait()
        self.log.close()
        return ""


def test_a_mid_call_elicitation_stops_the_call_then_the_answer_completes_it(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    endpoint = McpEndpoint(label="legacy", stdio=lambda: LocalProcess(log))
    (tool,) = mcp_list_tools(endpoint, timeout_seconds=10)
    pinned = tool.definition_sha256
    with pytest.raises(McpInputRequired) as asked:
        mcp_call_tool(
            endpoint, "confirm_write", {"path": "a.txt"},
            timeout_seconds=10, pinned_sha256=pinned,
        )  # fmt: skip
    assert asked.value.message == "Write a.txt?"
    assert asked.value.schema == {
        "type": "object",
        "properties": {"confirm": {"type": "boolean"}},
        "required": ["confirm"],
    }
    result = mcp_call_tool(
        endpoint, "confirm_write", {"path": "a.txt"}, timeout_seconds=10,
        pinned_sha256=pinned, elicitation_answers=[{"confirm": True}],
    )  # fmt: skip
    assert result.text == "written" and not result.is_error
    answers = [line for line in log.read_text().splitlines() if "answer" in line]
    assert '"action":"accept"' in answers[-1].replace(" ", "")
    assert '"confirm":true' in answers[-1].replace(" ", "")
