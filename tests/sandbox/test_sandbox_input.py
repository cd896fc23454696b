"""Bad input is refused before anything is spawned; missing layers refuse to run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from runs.sandbox import (
    Limits,
    NetworkPolicy,
    SandboxSettings,
    SandboxSpec,
    SandboxSpecError,
    SandboxUnavailable,
    run_in_sandbox,
)
from runs.sandbox import capabilities as capabilities_module
from runs.sandbox import runner as runner_module
from runs.sandbox.capabilities import require_layers
from runs.sandbox.spec import DEFAULT_REQUIRED_LAYERS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("something was spawned")

    monkeypatch.setattr(runner_module.subprocess, "Popen", refuse)


@pytest.mark.parametrize(
    "limits",
    [
        Limits(wall_seconds=math.nan),
        Limits(wall_seconds=math.inf),
        Limits(wall_seconds=-1),
        Limits(wall_seconds=0),
        Limits(cpu_seconds=math.nan),
        Limits(memory_mb=-5),
        Limits(pids=0),
        Limits(nofile=-1),
        Limits(output_bytes=0),
        Limits(fsize_mb=True),
        Limits(cpu_quota=math.inf),
    ],
)
def test_bad_limits_are_refused(
    settings: SandboxSettings, workspace: Path, no_spawn: None, limits: Limits
) -> None:
    with pytest.raises(SandboxSpecError):
        run_in_sandbox(
            SandboxSpec(argv=["true"], workspace=workspace, limits=limits), settings
        )


@pytest.mark.parametrize("argv", [[], "rm -rf /", [""], ["echo", 3], ["a\x00b"]])
def test_bad_argv_is_refused(
    settings: SandboxSettings, workspace: Path, no_spawn: None, argv: object
) -> None:
    with pytest.raises(SandboxSpecError):
        run_in_sandbox(SandboxSpec(argv=argv, workspace=workspace), settings)  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["/tmp", "/", "/etc", "../.."])
def test_workspace_outside_root_is_refused(
    settings: SandboxSettings, workspace: Path, no_spawn: None, where: str
) -> None:
    path = workspace / where if where.startswith("..") else Path(where)
    with pytest.raises(SandboxSpecError):
        run_in_sandbox(SandboxSpec(argv=["true"], workspace=path), settings)


@pytest.mark.parametrize(
    "text",
    ["all", "", "host", "host:0", "host:99999", "http://x:80", "a:1,,b:2", "h:p"],
)
def test_unknown_network_spec_is_refused(text: str) -> None:
    with pytest.raises(SandboxSpecError):
        NetworkPolicy.parse(text)


def test_network_spec_parses() -> None:
    policy = NetworkPolicy.parse("PyPI.org:443,[2001:db8::1]:8080")
    assert [str(t) for t in policy.allow] == ["pypi.org:443", "[2001:db8::1]:8080"]
    assert NetworkPolicy.parse("none").is_none


@pytest.mark.parametrize(
    "name", ["SECRET_KEY", "DATABASE_URL", "OPENAI_API_KEY", "GH_TOKEN"]
)
def test_secret_env_names_are_refused(
    settings: SandboxSettings, workspace: Path, no_spawn: None, name: str
) -> None:
    spec = SandboxSpec(argv=["true"], workspace=workspace, env={name: "x"})
    with pytest.raises(SandboxSpecError):
        run_in_sandbox(spec, settings)


def test_missing_layers_refuse_instead_of_running_unconfined(
    settings: SandboxSettings, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = capabilities_module.probe_host(settings)
    crippled = replace(real, bwrap=None, bwrap_works=False)
    monkeypatch.setattr(runner_module, "probe_host", lambda s: crippled)
    no_spawn = AssertionError("something was spawned")
    monkeypatch.setattr(
        runner_module.subprocess,
        "Popen",
        lambda *a, **k: (_ for _ in ()).throw(no_spawn),
    )
    with pytest.raises(SandboxUnavailable) as info:
        run_in_sandbox(SandboxSpec(argv=["true"], workspace=workspace), settings)
    assert "apt-get install bubblewrap" in str(info.value)
    assert "pidns" in info.value.missing


def test_minimum_set_is_configurable() -> None:
    planned = {name: True for name in DEFAULT_REQUIRED_LAYERS} | {"memory_limit": False}
    with pytest.raises(SandboxUnavailable):
        require_layers(planned, DEFAULT_REQUIRED_LAYERS)
    require_layers(planned, DEFAULT_REQUIRED_LAYERS - {"memory_limit"})


def test_unknown_required_layer_is_a_spec_error(
    settings: SandboxSettings, workspace: Path
) -> None:
    bad = replace(settings, required_layers=frozenset({"bwrap", "magic"}))
    with pytest.raises(SandboxSpecError):
        run_in_sandbox(SandboxSpec(argv=["true"], workspace=workspace), bad)


def _cli(
    *args: str, settings: SandboxSettings, layers: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "SANDBOX_WORKSPACE_ROOT": str(settings.workspace_root),
        "SANDBOX_STATE_DIR": str(settings.state_dir),
    }
    if layers is not None:
        env["SANDBOX_REQUIRED_LAYERS"] = layers
    return subprocess.run(
        [sys.executable, "-m", "runs.sandbox", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_cli_prints_one_json_object(settings: SandboxSettings) -> None:
    proc = _cli(
        "--timeout",
        "0.5",
        "--",
        "/usr/bin/python3",
        "-c",
        "import time; time.sleep(5)",
        settings=settings,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (
        result["ok"],
        result["exit_code"],
        result["signal"],
        result["timed_out"],
    ) == (False, None, 9, True)
    proc = _cli(
        "--nofile",
        "32",
        "--",
        "/usr/bin/python3",
        "-c",
        "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))",
        settings=settings,
    )
    assert json.loads(proc.stdout)["stdout"] == "(32, 32)\n"


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--timeout", "nan", "--", "true"],
        ["--network", "everything", "--", "true"],
        ["--memory", "-1", "--", "true"],
        ["--workspace", "/etc", "--", "true"],
    ],
)
def test_cli_usage_errors_exit_2(settings: SandboxSettings, args: list[str]) -> None:
    proc = _cli(*args, settings=settings)
    assert proc.returncode == 2
    assert "error:" in proc.stderr and proc.stdout == ""


def test_degraded_host_runs_with_what_it_has_and_says_so(
    settings: SandboxSettings, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An operator who lowered the minimum set on a host without bubblewrap still gets
    # the uid drop, rlimits and cgroup, and a map that shows what is missing.
    real = capabilities_module.probe_host(settings)
    no_bwrap = replace(real, bwrap=None, bwrap_works=False)
    monkeypatch.setattr(runner_module, "probe_host", lambda s: no_bwrap)
    lowered = replace(
        settings,
        required_layers=frozenset({"uid_drop", "rlimits", "cgroup_kill", "pids_limit"}),
    )
    spec = SandboxSpec(argv=["id", "-u"], workspace=workspace)
    r = run_in_sandbox(spec, lowered)
    assert r.ok and r.stdout == "65534\n"
    e = r.enforcement
    assert (e["bwrap"], e["pidns"], e["netns"], e["mountns"]) == (False,) * 4
    assert e["uid_drop"] and e["cgroup_kill"] and e["pids_limit"]
    with pytest.raises(SandboxUnavailable):  # an allowlist needs a netns
        run_in_sandbox(
            replace(spec, network=NetworkPolicy.parse("a.test:443")), lowered
        )


def test_a_host_without_cgroups_is_refused_by_default(
    settings: SandboxSettings, workspace: Path, tmp_path: Path
) -> None:
    # No cgroup hierarchy under the runner's cgroup root: no cgroup.kill, no
    # aggregate memory or pids limit. The minimum set includes them, so nothing
    # runs, and the refusal names them and the setting that may lower the set.
    host = replace(settings, cgroup_root=tmp_path)
    spec = SandboxSpec(
        argv=["sh", "-c", "echo ran > /workspace/ran.txt; echo ran"],
        workspace=workspace,
    )
    with pytest.raises(SandboxUnavailable) as info:
        run_in_sandbox(spec, host)
    assert info.value.missing == ["cgroup_kill", "memory_limit", "pids_limit"]
    assert "SANDBOX_REQUIRED_LAYERS" in str(info.value)
    assert "knowingly" in str(info.value)
    assert not (workspace / "ran.txt").exists()

    # An operator who lowered the set knowingly gets a run, and a map that says it
    # ran without them.
    lowered = replace(
        host,
        required_layers=DEFAULT_REQUIRED_LAYERS
        - {"cgroup_kill", "memory_limit", "pids_limit"},
    )
    r = run_in_sandbox(spec, lowered)
    assert r.ok and r.stdout == "ran\n", r.stderr
    e = r.enforcement
    assert e["cgroup"] == "none"
    assert (e["cgroup_kill"], e["memory_limit"], e["pids_limit"]) == (False,) * 3
    assert e["pidns"] and e["netns"] and e["uid_drop"]
    assert r.reap_confirmed is False  # nothing can confirm it without a cgroup


def test_the_cli_refusal_names_the_layers_and_the_setting(
    settings: SandboxSettings,
) -> None:
    env_layers = ",".join(sorted(DEFAULT_REQUIRED_LAYERS | {"cpu_quota", "magic"}))
    proc = _cli("--", "true", settings=settings, layers=env_layers)
    assert proc.returncode == 2 and "magic" in proc.stderr
    # The CLI reads the same SANDBOX_REQUIRED_LAYERS as the control plane.
    proc = _cli("--", "true", settings=settings, layers="bwrap,pidns")
    assert proc.returncode == 0 and json.loads(proc.stdout)["ok"] is True
