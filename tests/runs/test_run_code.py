"""run_code goes through the real sandbox runner; its result is the observation."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

from runs.models import ToolCall
from runs.sandbox import SandboxSettings
from runs.sandbox.spec import DEFAULT_REQUIRED_LAYERS
from runs.services import run_start
from runs.tools import run_code as run_code_module
from runs.tools.run_code import sandbox_settings


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


FILL_WORKSPACE = """
import sys
written = 0
try:
    for i in range(38):  # 600 MB in 16 MB files, each under the per-file limit
        with open(f"part{i:02}.bin", "wb") as f:
            for _ in range(256):
                written += f.write(b"x" * 65536)
except OSError as exc:
    print("stopped", exc.errno, written)
    sys.exit(1)
print("wrote", written)
"""


def _workspace_mounts() -> list[str]:
    root = str(Path(settings.SANDBOX_ROOT) / "workspaces") + "/"
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4] for line in mountinfo if line.split()[4].startswith(root)]


def test_a_program_filling_its_workspace_gets_edisk(scripted_agent, tenant, drive_run):
    # Before: only the 64 MB per-file limit applied and 600 MB ended ok: true.
    scripted_agent(run_code_script(FILL_WORKSPACE), ["run_code"])
    workspaces = Path(settings.SANDBOX_ROOT) / "workspaces"
    before = set(workspaces.iterdir()) if workspaces.is_dir() else set()
    run = drive_run(
        run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
    )
    call = ToolCall.objects.get(run=run)
    assert call.status == "failed"
    assert call.result["error"]["code"] == "EDISK"
    assert call.result["error"]["retryable"] is False
    stopped, errno, written = call.result["data"]["stdout"].split()
    assert (stopped, errno) == ("stopped", "28")  # ENOSPC inside
    bound = settings.SANDBOX_WORKSPACE_MB * 1024 * 1024
    assert 0 < int(written) <= bound
    assert call.sandbox_result["error"] == "EDISK"
    assert call.sandbox_result["enforcement"]["workspace_size"] == bound
    # The throwaway workspace and its filesystem are gone with the call.
    assert set(workspaces.iterdir()) == before
    assert _workspace_mounts() == []


def test_run_code_requires_the_full_minimum_set_by_default():
    # The product's minimum layers (docs/sandbox.md), cgroup ones included.
    assert frozenset(settings.SANDBOX_REQUIRED_LAYERS) == DEFAULT_REQUIRED_LAYERS
    assert {"cgroup_kill", "memory_limit", "pids_limit"} <= DEFAULT_REQUIRED_LAYERS
    assert sandbox_settings().required_layers == DEFAULT_REQUIRED_LAYERS


def test_a_host_without_cgroups_is_refused_until_an_operator_lowers_the_set(
    scripted_agent, tenant, drive_run, monkeypatch, tmp_path
):
    # A host without cgroups: the runner finds no hierarchy under its cgroup root.
    no_cgroups = functools.partial(SandboxSettings, cgroup_root=tmp_path)
    monkeypatch.setattr(run_code_module, "SandboxSettings", no_cgroups)
    scripted_agent(run_code_script("print('ran')"), ["run_code"])
    run = drive_run(
        run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
    )
    call = ToolCall.objects.get(run=run)
    assert call.status == "failed"
    message = call.result["error"]["message"]
    for name in ("cgroup_kill", "memory_limit", "pids_limit"):
        assert name in message, message
    assert "SANDBOX_REQUIRED_LAYERS" in message
    assert "ran" not in json.dumps(call.result)  # nothing was executed

    lowered = [
        layer
        for layer in settings.SANDBOX_REQUIRED_LAYERS
        if layer not in ("cgroup_kill", "memory_limit", "pids_limit")
    ]
    with override_settings(SANDBOX_REQUIRED_LAYERS=lowered):
        run = drive_run(
            run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
        )
    call = ToolCall.objects.get(run=run)
    assert call.status == "succeeded" and call.result["data"]["stdout"] == "ran\n"
    e = call.sandbox_result["enforcement"]
    assert e["cgroup"] == "none"
    assert (e["cgroup_kill"], e["memory_limit"], e["pids_limit"]) == (False,) * 3
    assert e["pidns"] and e["netns"] and e["uid_drop"]
