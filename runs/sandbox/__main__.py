"""`python -m runs.sandbox [options] -- CMD [ARGS...]`: run one command, print JSON.

Exit status 0 when the command was run and judged (whatever it did), 2 for a usage
error, 3 when the host cannot provide the required isolation layers.
`SANDBOX_WORKSPACE_ROOT`, `SANDBOX_STATE_DIR`, `SANDBOX_REQUIRED_LAYERS` (comma
separated) and `SANDBOX_WORKSPACE_MB` override the operator defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .capabilities import SandboxUnavailable
from .runner import run_in_sandbox
from .spec import (
    REQUIRED_LAYERS_SETTING,
    Limits,
    NetworkPolicy,
    SandboxSettings,
    SandboxSpec,
    SandboxSpecError,
)
from .workspace import workspace_create, workspace_release


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m runs.sandbox",
        description="Run one command in the sandbox and print the result as JSON.",
    )
    d = Limits()
    p.add_argument(
        "--timeout", type=float, default=d.wall_seconds, help="wall clock, s"
    )
    p.add_argument("--cpu", type=float, default=d.cpu_seconds, help="CPU time, s")
    p.add_argument("--memory", type=int, default=d.memory_mb, help="memory, MB")
    p.add_argument("--pids", type=int, default=d.pids, help="tasks (processes+threads)")
    p.add_argument("--fsize", type=int, default=d.fsize_mb, help="largest file, MB")
    p.add_argument("--nofile", type=int, default=d.nofile, help="open files")
    p.add_argument(
        "--max-output", type=int, default=d.output_bytes, help="bytes/stream"
    )
    p.add_argument("--tmpfs", type=int, default=d.tmpfs_mb, help="/tmp size, MB")
    p.add_argument(
        "--workspace", type=Path, help="workspace dir (default: a fresh one)"
    )
    p.add_argument("--network", default="none", help="none | [private:]HOST:PORT[,...]")
    p.add_argument("--path", action="append", default=[], help="path the command uses")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    return p


def settings_from_env(environ: dict[str, str]) -> SandboxSettings:
    """The operator settings, from the same variables as the control plane's."""
    base = SandboxSettings()
    layers = environ.get(REQUIRED_LAYERS_SETTING)
    size = environ.get("SANDBOX_WORKSPACE_MB", "").strip()
    if size and not size.isdigit():
        raise SandboxSpecError(f"SANDBOX_WORKSPACE_MB must be a number of MB: {size!r}")
    return SandboxSettings(
        workspace_root=Path(environ.get("SANDBOX_WORKSPACE_ROOT", base.workspace_root)),
        state_dir=Path(environ.get("SANDBOX_STATE_DIR", base.state_dir)),
        required_layers=(
            frozenset(item.strip() for item in layers.split(",") if item.strip())
            if layers is not None
            else base.required_layers
        ),
        workspace_mb=int(size) if size else base.workspace_mb,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        settings = settings_from_env(dict(os.environ))
        settings.validate()
        if not command:
            raise SandboxSpecError("no command given (use: -- CMD [ARGS...])")
        limits = Limits(
            wall_seconds=args.timeout,
            cpu_seconds=args.cpu,
            memory_mb=args.memory,
            pids=args.pids,
            fsize_mb=args.fsize,
            nofile=args.nofile,
            output_bytes=args.max_output,
            tmpfs_mb=args.tmpfs,
        )
        limits.validate()
        network = NetworkPolicy.parse(args.network)
    except SandboxSpecError as exc:
        parser.print_usage(sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    owned = args.workspace is None
    workspace = (
        workspace_create(settings=settings, label="cli") if owned else args.workspace
    )
    try:
        spec = SandboxSpec(
            argv=command,
            workspace=workspace,
            limits=limits,
            network=network,
            paths=args.path,
        )
        result = run_in_sandbox(spec, settings)
    except SandboxSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SandboxUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    finally:
        if owned:
            workspace_release(workspace, settings=settings)
    print(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
