"""The sandbox runner: every command a tool runs is contained, killed whole and
reported exactly. Pure Python, no Django; see docs/sandbox.md."""

from .capabilities import HostCapabilities, SandboxUnavailable, probe_host
from .janitor import JanitorReport, sandbox_janitor_sweep
from .paths import PathRefused, check_path, open_beneath
from .result import SandboxResult, decode_wait_status, decode_waitid
from .runner import run_in_sandbox
from .spare import release_spares
from .spec import (
    HostPort,
    InjectedCredential,
    Limits,
    NetworkPolicy,
    SandboxSettings,
    SandboxSpec,
    SandboxSpecError,
)
from .teardown import wait_for_teardown
from .workspace import workspace_create, workspace_release

__all__ = [
    "HostCapabilities",
    "HostPort",
    "InjectedCredential",
    "JanitorReport",
    "Limits",
    "NetworkPolicy",
    "PathRefused",
    "SandboxResult",
    "SandboxSettings",
    "SandboxSpec",
    "SandboxSpecError",
    "SandboxUnavailable",
    "check_path",
    "decode_wait_status",
    "decode_waitid",
    "open_beneath",
    "probe_host",
    "release_spares",
    "run_in_sandbox",
    "sandbox_janitor_sweep",
    "wait_for_teardown",
    "workspace_create",
    "workspace_release",
]
