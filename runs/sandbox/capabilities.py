"""What this host can enforce, probed once per process, and the minimum-layer gate."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .cgroup import CgroupLayout
from .launch import bwrap_argv, setpriv_argv
from .spec import REQUIRED_LAYERS_SETTING, SandboxSettings

# Why a layer may be missing, for the refusal message.
_LAYER_HINTS = {
    "bwrap": "install bubblewrap: apt-get install bubblewrap",
    "cgroup_kill": "needs a writable cgroup2 hierarchy (root, or a delegated subtree)",
    "memory_limit": "needs a writable memory cgroup controller",
    "pids_limit": "needs a writable pids cgroup controller",
    "cpu_quota": "needs a writable cpu cgroup controller",
}


class SandboxUnavailable(RuntimeError):
    """The host cannot provide the configured minimum set of isolation layers."""

    def __init__(self, missing: list[str], detail: str = "") -> None:
        self.missing = missing
        hints = [
            f"{name}: {_LAYER_HINTS[name]}" for name in missing if name in _LAYER_HINTS
        ]
        message = (
            f"sandbox refuses to run: required layers unavailable: {', '.join(missing)}"
        )
        if hints:
            message += f" ({'; '.join(hints)})"
        if detail:
            message += f"; {detail}"
        elif missing != ["cgroup"]:
            # A missing layer of the minimum set, not a failed start: say what an
            # operator can do about it, and that it is a decision.
            message += (
                "; an operator who accepts running without them may remove them from "
                f"{REQUIRED_LAYERS_SETTING} (settings.required_layers), knowingly"
            )
        super().__init__(message)


@dataclass(frozen=True)
class HostCapabilities:
    """Result of the start-up probe."""

    bwrap: str | None
    bwrap_version: str | None
    setpriv: str | None
    is_root: bool
    bwrap_works: bool  # a full-flag bubblewrap run succeeded (user/pid/net/mount ns)
    bwrap_error: str
    cgroup: CgroupLayout
    cgroup_writable: dict[str, bool] = field(default_factory=dict)

    def planned_layers(self) -> dict[str, bool]:
        """Layers a run on this host gets; `required_layers` is checked against it."""
        ns = self.bwrap_works
        writable = self.cgroup_writable
        v2 = writable.get("v2", False)
        v2c = self.cgroup.v2_controllers

        def controller(name: str) -> bool:
            return (v2 and name in v2c) or writable.get(name, False)

        return {
            "bwrap": ns,
            "userns": ns,
            "pidns": ns,
            "netns": ns,
            "mountns": ns,
            "tmpfs_size": ns,
            "uid_drop": (self.is_root and self.setpriv is not None) or not self.is_root,
            "no_new_privs": self.setpriv is not None or ns,
            "rlimits": True,
            "cgroup_kill": v2,
            "memory_limit": controller("memory"),
            "pids_limit": controller("pids"),
            "cpu_quota": controller("cpu"),
        }


_lock = threading.Lock()
_cached: dict[tuple[str, str, str], HostCapabilities] = {}


def probe_host(settings: SandboxSettings, *, refresh: bool = False) -> HostCapabilities:
    """Probe bubblewrap, namespaces and cgroups once per process (thread-safe)."""
    key = (str(settings.state_dir), settings.cgroup_group, str(settings.cgroup_root))
    with _lock:
        if refresh or key not in _cached:
            _cached[key] = _probe(settings)
        return _cached[key]


def require_layers(planned: dict[str, bool], required: frozenset[str]) -> None:
    missing = sorted(name for name in required if not planned.get(name, False))
    if missing:
        raise SandboxUnavailable(missing)


def _probe(settings: SandboxSettings) -> HostCapabilities:
    bwrap = shutil.which("bwrap")
    setpriv = shutil.which("setpriv")
    is_root = os.geteuid() == 0
    version = None
    works = False
    error = ""
    if bwrap:
        try:
            out = subprocess.run(
                [bwrap, "--version"], capture_output=True, text=True, timeout=5
            )
            version = out.stdout.strip() or None
            works, error = _probe_bwrap(bwrap, setpriv, settings, is_root)
        except (OSError, subprocess.SubprocessError) as exc:
            error = str(exc)
    else:
        error = "bwrap not found on PATH"
    layout = CgroupLayout.detect(settings.cgroup_root)
    return HostCapabilities(
        bwrap=bwrap,
        bwrap_version=version,
        setpriv=setpriv,
        is_root=is_root,
        bwrap_works=works,
        bwrap_error=error,
        cgroup=layout,
        cgroup_writable=_probe_cgroups(layout, settings.cgroup_group),
    )


def _probe_bwrap(
    bwrap: str, setpriv: str | None, settings: SandboxSettings, is_root: bool
) -> tuple[bool, str]:
    probe_dir = settings.state_dir / "probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    if is_root:
        os.chown(probe_dir, settings.sandbox_uid, settings.sandbox_gid)
    argv = bwrap_argv(
        bwrap,
        uid=settings.sandbox_uid if is_root else os.getuid(),
        gid=settings.sandbox_gid if is_root else os.getgid(),
        workspace=probe_dir,
        tmp_source=probe_dir,
    ) + ["true"]
    if is_root:
        if setpriv is None:
            return False, "setpriv not found (needed to drop root before bwrap)"
        argv = setpriv_argv(setpriv, settings.sandbox_uid, settings.sandbox_gid) + argv
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd="/")
    if proc.returncode != 0:
        return False, f"bwrap probe failed: {proc.stderr.strip()[:300]}"
    return True, ""


def _probe_cgroups(layout: CgroupLayout, group: str) -> dict[str, bool]:
    found: dict[str, bool] = {}
    candidates: dict[str, Path] = {c: p for c, p in layout.v1_roots.items()}
    if layout.v2_root is not None:
        candidates["v2"] = layout.v2_root
    for key, root in candidates.items():
        probe = root / group / f"probe-{os.getpid()}"
        try:
            (root / group).mkdir(exist_ok=True)
            probe.mkdir(exist_ok=True)
            probe.rmdir()
            found[key] = True
        except OSError:
            found[key] = False
    return found
