"""run_code goes through the real sandbox runner; its result is the observation."""

from __future__ import annotations

import shutil

import pytest

from runs.models import ToolCall
from runs.services import run_start


@pytest.fixture(autouse=True)
def bubblewrap_installed():
    assert shutil.which("bwrap"), (
        "run_code needs bubblewrap: apt-get install bubblewrap"
    )


def run_code_script(code: str) -> list[dict]:
    return [
        {"tool_calls": [{"id": "c1", "name": "run_code", "arguments": {"code": code}}]},
        {"text": "done"},
    ]


def test_run_code_output_and_enforcement_reach_the_observation(
    scripted_agent, tenant, drive_run, monkeypatch
):
    monkeypatch.setenv("SECRET_KEY", "worker-secret-do-not-leak")
    code = "import os; print(6 * 7); print(sorted(os.environ))"
    scripted_agent(run_code_script(code), ["run_code"])
    run = drive_run(
        run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
    )
    call = ToolCall.objects.get(run=run)
    assert call.status == "succeeded", call.result
    assert call.result["data"]["exit_code"] == 0
    stdout = call.result["data"]["stdout"]
    assert stdout.startswith("42\n")
    assert "SECRET_KEY" not in stdout and "DATABASE_URL" not in stdout
    assert call.sandbox_result["enforcement"]["netns"] is True
    assert call.sandbox_result["enforcement"]["uid_drop"] is True
    assert call.sandbox_result["reap_confirmed"] is True
    assert "tool_output_untrusted" in call.observation["content"]


def test_a_failing_program_is_an_error_observation_the_model_can_fix(
    scripted_agent, tenant, drive_run
):
    scripted_agent(run_code_script("raise SystemExit(3)"), ["run_code"])
    run = drive_run(
        run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
    )
    call = ToolCall.objects.get(run=run)
    assert call.status == "failed"
    assert call.result["error"]["code"] == "EINVAL"
    assert "exit code 3" in call.result["error"]["message"]
    assert run.status == "unverified"  # the run went on to the final answer


def test_a_program_with_no_network_cannot_reach_anything(
    scripted_agent, tenant, drive_run
):
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )
    scripted_agent(run_code_script(code), ["run_code"])
    run = drive_run(
        run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
    )
    call = ToolCall.objects.get(run=run)
    assert call.result["data"]["stdout"].startswith("refused")
