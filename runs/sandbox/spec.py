"""What a caller asks the sandbox to run, and the operator settings around it.

Everything here is validated before anything is spawned: a bad limit, an empty argv,
a workspace outside the configured root or an unknown network spec raises
`SandboxSpecError` and no process, cgroup or file is created.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Host name or IP literal, then a port. IPv6 literals are written in brackets.
_HOST_PORT = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]+)):(?P<port>\d{1,5})$"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names that must never be handed to a workload even if a caller passes them on
# purpose: the worker's own credentials live under these names.
_SECRET_ENV = re.compile(
    r"(SECRET|PASSWORD|PASSWD|TOKEN|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL"
    r"|DATABASE_URL|REDIS_URL|BROKER_URL|DSN)",
    re.IGNORECASE,
)

Resolver = Callable[[str, int], list[str]]


class SandboxSpecError(ValueError):
    """The spec is invalid; nothing was spawned."""


# The prefix of an allowlist entry an admin marks as private: its host may resolve
# to (or be) a loopback, private or link-local address. Never cloud metadata.
PRIVATE_PREFIX = "private:"


@dataclass(frozen=True)
class HostPort:
    """One allowlisted egress target. `private`: the admin listed it as a private
    destination, so loopback, private and link-local addresses are not refused."""

    host: str
    port: int
    private: bool = False

    def __str__(self) -> str:
        text = (
            f"[{self.host}]:{self.port}"
            if ":" in self.host
            else f"{self.host}:{self.port}"
        )
        return PRIVATE_PREFIX + text if self.private else text

    @property
    def key(self) -> tuple[str, int]:
        return (self.host, self.port)

    @classmethod
    def parse(cls, text: str) -> HostPort:
        """`host:port`, `[v6]:port`, either behind `private:`; SandboxSpecError if
        malformed (the message says which form is expected)."""
        if not isinstance(text, str):
            raise SandboxSpecError("an egress target must be a string 'HOST:PORT'")
        item = text.strip()
        private = item.lower().startswith(PRIVATE_PREFIX)
        if private:
            item = item[len(PRIVATE_PREFIX) :]
        m = _HOST_PORT.match(item)
        if not m:
            raise SandboxSpecError(
                f"{text!r} is not HOST:PORT (IPv6 as [ADDR]:PORT, optionally "
                f"behind {PRIVATE_PREFIX!r})"
            )
        port = int(m.group("port"))
        if not 1 <= port <= 65535:
            raise SandboxSpecError(f"port out of range in {text!r}")
        host = (m.group("v6") or m.group("host") or "").lower().rstrip(".")
        if not host or host.startswith(".") or ".." in host:
            raise SandboxSpecError(f"empty or malformed host in {text!r}")
        return cls(host, port, private)


@dataclass(frozen=True)
class InjectedCredential:
    """A header the proxy adds to requests for one target; the sandbox never sees
    `value`. `tls`: the proxy opens TLS to the upstream itself (the sandbox sends it
    plain HTTP), verified against the system CAs or `SandboxSettings.egress_ca_file`.
    """

    host: str
    port: int
    header: str
    value: str = field(repr=False)
    tls: bool
    secret_name: str = ""  # only the name: it may be logged and shown

    @property
    def key(self) -> tuple[str, int]:
        return (self.host, self.port)


@dataclass(frozen=True)
class NetworkPolicy:
    """`none` (loopback only) or an allowlist reached through the runner's proxy,
    with the credentials it injects for some of the listed targets."""

    allow: tuple[HostPort, ...] = ()
    credentials: tuple[InjectedCredential, ...] = field(default=(), repr=False)

    @property
    def is_none(self) -> bool:
        return not self.allow

    @classmethod
    def parse(cls, text: str) -> NetworkPolicy:
        """Parse `none` or `host:port,private:host:port,...`."""
        text = text.strip()
        if text == "none":
            return cls()
        targets: list[HostPort] = []
        for item in text.split(","):
            try:
                targets.append(HostPort.parse(item))
            except SandboxSpecError as exc:
                raise SandboxSpecError(
                    f"unknown network spec: {exc}; use 'none' or "
                    "HOST:PORT[,HOST:PORT...]"
                ) from None
        return cls(tuple(targets))

    def validate(self) -> None:
        listed = {target.key for target in self.allow}
        for credential in self.credentials:
            if credential.key not in listed:
                raise SandboxSpecError(
                    f"a credential for {credential.host}:{credential.port}, "
                    "which is not on the allowlist"
                )
            if any(c in credential.value for c in "\r\n\x00"):
                raise SandboxSpecError(
                    f"the credential for {credential.host}:{credential.port} "
                    "contains a line break or NUL and cannot be sent as a header"
                )


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run. None means "no limit of this kind"."""

    wall_seconds: float = 30.0
    cpu_seconds: float | None = 10.0
    memory_mb: int | None = 512
    pids: int | None = 64
    fsize_mb: int | None = 64
    nofile: int | None = 256
    output_bytes: int = 1_000_000
    tmpfs_mb: int = 64  # /tmp
    shm_mb: int = 64  # /dev/shm (POSIX shared memory, multiprocessing's semaphores)
    # RLIMIT_AS is per process and counts reservations, not RSS; by default it is set
    # well above memory_mb so that the aggregate cgroup limit is what a hog meets.
    address_space_mb: int | None = None
    cpu_quota: float | None = 1.0  # CPU bandwidth in cores (cgroup cpu controller)

    def validate(self) -> None:
        _positive_finite("wall_seconds", self.wall_seconds)
        if self.cpu_seconds is not None:
            _positive_finite("cpu_seconds", self.cpu_seconds)
        if self.cpu_quota is not None:
            _positive_finite("cpu_quota", self.cpu_quota)
        for name in ("memory_mb", "pids", "fsize_mb", "nofile", "address_space_mb"):
            value = getattr(self, name)
            if value is not None:
                _positive_int(name, value)
        _positive_int("output_bytes", self.output_bytes)
        _positive_int("tmpfs_mb", self.tmpfs_mb)
        _positive_int("shm_mb", self.shm_mb)
        if self.nofile is not None and self.nofile < 8:
            raise SandboxSpecError(
                "nofile must be at least 8 (the init needs a few fds)"
            )
        if self.pids is not None and self.pids < 4:
            raise SandboxSpecError("pids must be at least 4 (bwrap, init and workload)")
        if self.memory_mb is not None and self.memory_mb < 32:
            raise SandboxSpecError(
                "memory_mb must be at least 32 (the init itself needs ~10)"
            )

    def effective_address_space_mb(self) -> int | None:
        if self.address_space_mb is not None:
            return self.address_space_mb
        if self.memory_mb is None:
            return None
        return max(self.memory_mb * 4, 1024)


@dataclass(frozen=True)
class SandboxSpec:
    """One command: argv (never a shell string), env, workspace, limits, network."""

    argv: Sequence[str]
    workspace: Path | str
    env: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    # Paths (relative to the workspace) the command is about to use; each is resolved
    # beneath the workspace before anything runs, and an escape gives EPATH.
    paths: Sequence[str] = ()
    stdin_data: bytes | None = None
    # Host directories bound read-only at the same path inside (an operator's
    # choice, e.g. the Python packages an MCP stdio server imports).
    readonly_paths: Sequence[str] = ()


# The layers `required_layers` may name; see docs/sandbox.md.
KNOWN_LAYERS = frozenset(
    {
        "bwrap",
        "userns",
        "pidns",
        "netns",
        "mountns",
        "uid_drop",
        "no_new_privs",
        "rlimits",
        "cgroup_kill",
        "memory_limit",
        "pids_limit",
        "cpu_quota",
        "tmpfs_size",
    }
)
# The environment variable an operator sets it with (the CLI and the control plane).
REQUIRED_LAYERS_SETTING = "SANDBOX_REQUIRED_LAYERS"
# The product's minimum set (docs/sandbox.md); the control plane's default too.
DEFAULT_REQUIRED_LAYERS = frozenset(
    {
        "bwrap",
        "pidns",
        "netns",
        "mountns",
        "uid_drop",
        "no_new_privs",
        "rlimits",
        "cgroup_kill",
        "memory_limit",
        "pids_limit",
    }
)


@dataclass(frozen=True)
class SandboxSettings:
    """Operator-level configuration (not something a tool or a model can set)."""

    workspace_root: Path = Path("/var/lib/agent-sandbox/workspaces")
    state_dir: Path = Path("/var/lib/agent-sandbox/state")
    cgroup_group: str = "agent-sandbox"
    sandbox_uid: int = 65534
    sandbox_gid: int = 65534
    python: str = "/usr/bin/python3"
    # "auto": the C init when a C compiler is present and the run needs no network
    # bridge, else the Python init; "python": always the Python init.
    init: str = "auto"
    required_layers: frozenset[str] = DEFAULT_REQUIRED_LAYERS
    # Total size of a workspace made by workspace_create (its own tmpfs, so RAM:
    # pages a run writes count against that run's memory limit); None: a plain
    # directory on the workspace root's filesystem, bounded per file only.
    workspace_mb: int | None = 128
    # Where the cgroup hierarchies are mounted (probe_host and the janitor).
    cgroup_root: Path = Path("/sys/fs/cgroup")
    # Kill the run as soon as the pids controller refuses a fork (CG-R5).
    kill_on_pids_limit: bool = True
    # Test-only escape hatch: lets the proxy reach loopback addresses that are
    # explicitly allowlisted. Private, link-local and metadata ranges stay refused.
    allow_loopback_targets: bool = False
    resolver: Resolver | None = None
    proxy_port: int = 3128
    # CA bundle the proxy verifies upstream TLS against when it opens TLS itself
    # (credentialed targets); None: the system's CAs.
    egress_ca_file: str | None = None

    def validate(self) -> None:
        if self.init not in ("auto", "python"):
            raise SandboxSpecError(
                f"settings.init must be 'auto' or 'python', not {self.init!r}"
            )
        self.validate_workspace_mb()
        unknown = self.required_layers - KNOWN_LAYERS
        if unknown:
            raise SandboxSpecError(f"unknown required layers: {sorted(unknown)}")
        if not os.path.isabs(self.python) or not os.access(self.python, os.X_OK):
            raise SandboxSpecError(
                f"settings.python {self.python!r} must be an absolute, executable path"
            )

    def validate_workspace_mb(self) -> None:
        if self.workspace_mb is not None:
            _positive_int("settings.workspace_mb", self.workspace_mb)


def validate_spec(spec: SandboxSpec, settings: SandboxSettings) -> Path:
    """Check a spec before anything is spawned; return the resolved workspace."""
    if isinstance(spec.argv, str | bytes):
        raise SandboxSpecError("argv must be a list of strings, never a shell string")
    if not spec.argv:
        raise SandboxSpecError("argv is empty")
    for arg in spec.argv:
        if not isinstance(arg, str):
            raise SandboxSpecError(f"argv items must be str, got {type(arg).__name__}")
        if "\x00" in arg:
            raise SandboxSpecError("argv items must not contain NUL")
    if not spec.argv[0]:
        raise SandboxSpecError("argv[0] is empty")
    if not isinstance(spec.limits, Limits):
        raise SandboxSpecError("limits must be a Limits")
    spec.limits.validate()
    if not isinstance(spec.network, NetworkPolicy):
        raise SandboxSpecError(
            "network must be a NetworkPolicy (see NetworkPolicy.parse)"
        )
    spec.network.validate()
    for key, value in spec.env.items():
        if not _ENV_NAME.match(key) or "\x00" in value:
            raise SandboxSpecError(f"invalid environment variable name {key!r}")
        if _SECRET_ENV.search(key):
            raise SandboxSpecError(f"refusing to pass secret-looking variable {key!r}")
    for p in spec.paths:
        if not isinstance(p, str) or "\x00" in p:
            raise SandboxSpecError("paths must be strings without NUL")
    for p in spec.readonly_paths:
        if not isinstance(p, str) or "\x00" in p or not os.path.isabs(p):
            raise SandboxSpecError("readonly_paths must be absolute paths")
        if not os.path.isdir(p):
            raise SandboxSpecError(f"readonly path {p} is not a directory")
    root = _real_dir(settings.workspace_root)
    workspace = _real_dir(spec.workspace)
    if workspace == root or not workspace.startswith(root.rstrip("/") + "/"):
        raise SandboxSpecError(f"workspace {spec.workspace} is not beneath {root}")
    if not os.path.isdir(workspace):
        raise SandboxSpecError(f"workspace {workspace} is not a directory")
    return Path(workspace)


def _real_dir(path: Path | str) -> str:
    """os.path.realpath(path), resolved by the kernel in three syscalls when `path`
    is a directory (realpath walks it in Python, one lstat per component)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return os.path.realpath(path)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)
    finally:
        os.close(fd)


def _positive_finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SandboxSpecError(f"{name} must be a number")
    if not math.isfinite(value) or value <= 0:
        raise SandboxSpecError(f"{name} must be finite and > 0, got {value!r}")


def _positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SandboxSpecError(f"{name} must be an integer")
    if value <= 0:
        raise SandboxSpecError(f"{name} must be > 0, got {value!r}")
