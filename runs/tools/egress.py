"""A tool's egress settings: where it may connect through the sandbox's proxy and
which tenant secrets the proxy adds to its requests (docs/sandbox.md, "Egress").

`tool_settings[ref]` of an agent version (and an MCP stdio server's `network`):

    "network": ["api.example.com:443", "private:10.0.0.5:5432", "[2001:db8::1]:443"]
    "credentials": {
        "api.example.com:443": {"secret": "PARTNER_KEY",   # a tenant secret's name
                                "header": "Authorization",  # default
                                "prefix": "Bearer ",        # default ""
                                "tls": true},               # default: port == 443
    }

`private:` is the admin's explicit permission for that entry to be (or resolve to) a
loopback, private or link-local address; without it those are refused, on the
address the proxy actually connects to. Cloud metadata is refused for every entry.
A credentialed target is reached with plain `http://host:port/...` requests through
the proxy, which adds the header and (with `tls`) opens TLS upstream itself: the
secret is read here, on the host, and lives only in the proxy's memory.

`egress_settings_errors` is the validator the agent and MCP server APIs call (field
path -> message); `egress_policy_for` builds the sandbox's NetworkPolicy at call time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from controlplane.secrets import secret_exists
from runs.sandbox import HostPort, InjectedCredential, NetworkPolicy, SandboxSpecError

NETWORK = "network"
CREDENTIALS = "credentials"
MAX_TARGETS = 32
MAX_PREFIX_CHARS = 64
CREDENTIAL_KEYS = frozenset({"secret", "header", "prefix", "tls"})
DEFAULT_HEADER = "Authorization"
# The agreed secret-name form (controlplane.secrets).
_SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
# An HTTP field name (RFC 9110 token).
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}\Z")
# Headers the proxy itself owns or that would change how the request is framed.
_RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
    }
)


class EgressSettingsError(ValueError):
    """Egress settings that cannot be used; `field` is the path to fix."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


def egress_network_errors(value: Any, *, field: str) -> dict[str, str]:
    """Problems of one `network` list (field path -> message); {} when valid."""
    if value is None:
        return {}
    if not isinstance(value, list):
        return {field: "must be a list of 'HOST:PORT' strings"}
    if len(value) > MAX_TARGETS:
        return {field: f"at most {MAX_TARGETS} entries"}
    errors: dict[str, str] = {}
    for index, item in enumerate(value):
        try:
            HostPort.parse(item)
        except SandboxSpecError as exc:
            errors[f"{field}[{index}]"] = str(exc)
    return errors


def egress_settings_errors(
    settings: Any, *, field: str, tenant_id: Any = None
) -> dict[str, str]:
    """Problems of the `network` and `credentials` keys of one tool's settings, by
    field path (`{field}.network[1]`, `{field}.credentials.api.test:443.header`);
    {} when valid. Other keys are not looked at (the caller owns them). With
    `tenant_id`, a credential naming a secret the tenant does not have is one too."""
    errors = _shape_errors(settings, field=field)
    if tenant_id is None or errors:
        return errors
    for key, entry in ((settings or {}).get(CREDENTIALS) or {}).items():
        if not secret_exists(tenant_id=tenant_id, name=entry["secret"]):
            errors[f"{field}.{CREDENTIALS}.{key}.secret"] = (
                f"secret {entry['secret']!r} is not set in this tenant"
            )
    return errors


def _shape_errors(settings: Any, *, field: str) -> dict[str, str]:
    if settings is None:
        return {}
    if not isinstance(settings, Mapping):
        return {field: "must be an object"}
    errors = egress_network_errors(settings.get(NETWORK), field=f"{field}.{NETWORK}")
    credentials = settings.get(CREDENTIALS)
    if credentials is None:
        return errors
    where = f"{field}.{CREDENTIALS}"
    if not isinstance(credentials, Mapping):
        return {**errors, where: "must be an object keyed by 'HOST:PORT'"}
    listed = _listed(settings.get(NETWORK))
    for key, entry in credentials.items():
        errors.update(_credential_errors(key, entry, listed, where=f"{where}.{key}"))
    return errors


def _listed(network: Any) -> set[tuple[str, int]]:
    listed: set[tuple[str, int]] = set()
    for item in network if isinstance(network, list) else ():
        try:
            listed.add(HostPort.parse(item).key)
        except SandboxSpecError:
            continue
    return listed


def _credential_errors(
    key: Any, entry: Any, listed: set[tuple[str, int]], *, where: str
) -> dict[str, str]:
    try:
        target = HostPort.parse(key)
    except SandboxSpecError as exc:
        return {where: str(exc)}
    if target.private:
        return {where: "name the target as HOST:PORT, without 'private:'"}
    if target.key not in listed:
        return {where: f"{key} is not in the tool's network list"}
    if not isinstance(entry, Mapping):
        return {where: "must be an object with 'secret' (and 'header', 'prefix')"}
    errors: dict[str, str] = {}
    unknown = set(entry) - CREDENTIAL_KEYS
    if unknown:
        errors[where] = f"unknown keys {sorted(map(str, unknown))}"
    secret = entry.get("secret")
    if not isinstance(secret, str) or not _SECRET_NAME.match(secret):
        errors[f"{where}.secret"] = (
            "must name a secret: letters, digits and _, not starting with a digit"
        )
    header = entry.get("header", DEFAULT_HEADER)
    if not isinstance(header, str) or not _HEADER_NAME.match(header):
        errors[f"{where}.header"] = "must be an HTTP header name"
    elif header.lower() in _RESERVED_HEADERS or header.lower().startswith("proxy-"):
        errors[f"{where}.header"] = f"{header!r} is set by the proxy itself"
    prefix = entry.get("prefix", "")
    if (
        not isinstance(prefix, str)
        or len(prefix) > MAX_PREFIX_CHARS
        or any(not (" " <= ch <= "~") for ch in prefix)
    ):
        errors[f"{where}.prefix"] = (
            f"must be printable ASCII, at most {MAX_PREFIX_CHARS} characters"
        )
    if "tls" in entry and not isinstance(entry["tls"], bool):
        errors[f"{where}.tls"] = "must be true or false"
    return errors


def egress_secret_names(settings: Mapping[str, Any] | None) -> list[str]:
    """The secret names a tool's settings refer to (for existence checks)."""
    credentials = (settings or {}).get(CREDENTIALS)
    if not isinstance(credentials, Mapping):
        return []
    return sorted(
        {
            entry["secret"]
            for entry in credentials.values()
            if isinstance(entry, Mapping) and isinstance(entry.get("secret"), str)
        }
    )


def egress_targets(settings: Mapping[str, Any] | None) -> list[HostPort]:
    """The parsed `network` entries (valid settings assumed; invalid ones skipped)."""
    out: list[HostPort] = []
    network = (settings or {}).get(NETWORK)
    for item in network if isinstance(network, list) else ():
        try:
            out.append(HostPort.parse(item))
        except SandboxSpecError:
            continue
    return out


def egress_policy_for(
    settings: Mapping[str, Any] | None,
    *,
    secret_value: Any,
    field: str = "tool_settings",
) -> NetworkPolicy:
    """The sandbox's NetworkPolicy for one tool: the allowlist and, for each
    credential, the header the proxy adds. `secret_value(name) -> str` reads the
    tenant's secret on the host (it raises, naming the secret, when one is not set).
    Raises EgressSettingsError when the settings are invalid."""
    errors = egress_settings_errors(settings, field=field)
    if errors:
        path, message = next(iter(errors.items()))
        raise EgressSettingsError(path, message)
    settings = settings or {}
    credentials: list[InjectedCredential] = []
    for key, entry in (settings.get(CREDENTIALS) or {}).items():
        target = HostPort.parse(key)
        value = secret_value(entry["secret"])
        if any(ch in value for ch in "\r\n\x00"):
            raise EgressSettingsError(
                f"{field}.{CREDENTIALS}.{key}.secret",
                f"secret {entry['secret']!r} holds a line break or NUL and cannot "
                "be sent as a header",
            )
        credentials.append(
            InjectedCredential(
                target.host,
                target.port,
                header=entry.get("header", DEFAULT_HEADER),
                value=entry.get("prefix", "") + value,
                tls=entry.get("tls", target.port == 443),
                secret_name=entry["secret"],
            )
        )
    return NetworkPolicy(tuple(egress_targets(settings)), tuple(credentials))
