"""The eight-field tool contract (spec/loop-tools-protocol.md §1.4).

The model sees three fields (`name`, `description`, `input_schema`); the host keeps
the other five (`preconditions`, `effect`, `idempotency`, `cost`, `auth_scope`).
Missing facts are filled in conservatively: an undeclared effect is an irreversible
external write, and a tool of unknown origin is untrusted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from runs.engine.validation import prepare_schema

TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class Effect(StrEnum):
    READ_ONLY = "read_only"
    IDEMPOTENT_WRITE = "idempotent_write"
    WRITE = "write"
    IRREVERSIBLE_EXTERNAL = "irreversible_external"


class Idempotency(StrEnum):
    NATURAL = "natural"  # repeating the call has the same effect as once
    REQUIRED_KEY = "required_key"  # the tool deduplicates by an idempotency key
    NONE = "none"


class ToolSource(StrEnum):
    BUILTIN = "builtin"  # shipped with the control plane
    TRUSTED = "trusted"  # registered by an operator from a trusted registry
    UNTRUSTED = "untrusted"  # anything else: its self-description is not believed


class ApprovalNeed(StrEnum):
    """An admin's word on a tool's approval, over the tenant's rules and defaults."""

    POLICY = "policy"  # the tenant's rules and the defaults decide
    ALWAYS = "always"  # every call waits for a human (a deny rule still denies)
    NEVER = "never"  # runs without asking (a deny rule still denies)


class ContractError(ValueError):
    """A tool contract is malformed."""


# --- auth_scope --------------------------------------------------------------------
#
#   auth_scope := clause (" " clause)*
#   clause     := "secrets:" NAME ("," NAME)*       tenant secrets the tool may read
#               | "permissions:" PERM ("," PERM)*   control-plane actions (run.start,
#                                                   budget.write, ...) the run's
#                                                   starter must hold in its tenant
#               | SCOPE                             an external scope the tool acts
#                                                   under ("payments:refund"), for
#                                                   its own credential; not a role
#
# e.g. "secrets:SHOP_API_KEY permissions:budget.write payments:refund". No clause
# (None or "") means the tool may read no secret and needs no permission.

SECRET_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
PERMISSION_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
EXTERNAL_SCOPE_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+:[A-Za-z0-9_.*-]+$")


@dataclass(frozen=True)
class AuthScope:
    secrets: frozenset[str] = frozenset()
    permissions: frozenset[str] = frozenset()
    external: tuple[str, ...] = ()


def parse_auth_scope(text: str | None) -> AuthScope:
    """The parsed `auth_scope`; ContractError naming the clause that is wrong."""
    secrets: set[str] = set()
    permissions: set[str] = set()
    external: list[str] = []
    for clause in (text or "").split():
        kind, _, rest = clause.partition(":")
        if kind in ("secrets", "permissions"):
            names = rest.split(",")
            pattern = SECRET_NAME_PATTERN if kind == "secrets" else PERMISSION_PATTERN
            bad = [name for name in names if not pattern.match(name)]
            if bad:
                raise ContractError(
                    f"auth_scope {kind}: {bad[0]!r} must match {pattern.pattern}"
                )
            (secrets if kind == "secrets" else permissions).update(names)
        elif EXTERNAL_SCOPE_PATTERN.match(clause):
            external.append(clause)
        else:
            raise ContractError(
                f"auth_scope clause {clause!r} is not secrets:NAME,..., "
                "permissions:ACTION,... or an external scope like payments:refund"
            )
    return AuthScope(frozenset(secrets), frozenset(permissions), tuple(external))


# --- cost.quota --------------------------------------------------------------------
#
#   quota := item (";" item)*
#   item  := [BUCKET ":"] COUNT "/" PERIOD     PERIOD: run | minute | hour | day | week
#
# "5/run" (five calls per run), "100/day" (per tenant and UTC day), "billing:100/hour"
# (a bucket several tools may share; the default bucket is the tool's name).

QUOTA_PERIODS = ("run", "minute", "hour", "day", "week")
_QUOTA_ITEM = re.compile(
    r"^(?:(?P<bucket>[A-Za-z0-9_.-]{1,64}):)?(?P<count>[0-9]{1,9})/(?P<period>[a-z]+)$"
)


@dataclass(frozen=True)
class QuotaLimit:
    bucket: str
    limit: int
    period: str  # one of QUOTA_PERIODS

    @property
    def per_run(self) -> bool:
        return self.period == "run"

    def describe(self) -> str:
        return f"{self.limit} call(s) per {self.period} ({self.bucket})"


def parse_quota(text: str | None, *, tool_name: str) -> tuple[QuotaLimit, ...]:
    """The parsed `cost.quota`; ContractError naming the item that is wrong."""
    limits: list[QuotaLimit] = []
    for item in (text or "").split(";"):
        item = item.strip()
        if not item:
            continue
        match = _QUOTA_ITEM.match(item)
        if match is None or match["period"] not in QUOTA_PERIODS:
            raise ContractError(
                f"cost.quota item {item!r} must be [bucket:]COUNT/PERIOD with PERIOD "
                f"one of {', '.join(QUOTA_PERIODS)} (e.g. 5/run;100/day)"
            )
        limits.append(
            QuotaLimit(
                match["bucket"] or tool_name, int(match["count"]), match["period"]
            )
        )
    return tuple(limits)


@dataclass(frozen=True)
class ToolCost:
    money_cents: int = 0
    latency_p95_ms: int | None = None
    quota: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "money_cents": self.money_cents,
            "latency_p95_ms": self.latency_p95_ms,
            "quota": self.quota,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ToolCost:
        data = data or {}
        latency = data.get("latency_p95_ms")
        quota = data.get("quota")
        return cls(
            money_cents=int(data.get("money_cents", 0)),
            latency_p95_ms=None if latency is None else int(latency),
            quota=None if quota is None else str(quota),
        )


def _coerce_enum(enum: type[StrEnum], value: object, fallback: StrEnum) -> Any:
    try:
        return enum(str(value))
    except ValueError:
        return fallback


@dataclass(frozen=True)
class ToolContract:
    """One tool's contract; `input_schema` is checked and closed on construction."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    preconditions: tuple[str, ...] = ()
    effect: Effect = Effect.IRREVERSIBLE_EXTERNAL
    idempotency: Idempotency = Idempotency.NONE
    cost: ToolCost = field(default_factory=ToolCost)
    auth_scope: str | None = None
    source: ToolSource = ToolSource.UNTRUSTED
    version: str = "1"
    approval: ApprovalNeed = ApprovalNeed.POLICY

    def __post_init__(self) -> None:
        if not TOOL_NAME_PATTERN.match(self.name):
            raise ContractError(
                f"tool name {self.name!r} must match {TOOL_NAME_PATTERN.pattern}"
            )
        if not self.description.strip():
            raise ContractError(f"tool {self.name!r} needs a description")
        object.__setattr__(self, "input_schema", prepare_schema(self.input_schema))
        object.__setattr__(self, "preconditions", tuple(self.preconditions))
        # Checked now: a contract whose host-only fields cannot take effect is
        # refused when the tool is built, not when it is first called.
        parse_auth_scope(self.auth_scope)
        parse_quota(self.cost.quota, tool_name=self.name)

    @cached_property
    def scope(self) -> AuthScope:
        return parse_auth_scope(self.auth_scope)

    @cached_property
    def quotas(self) -> tuple[QuotaLimit, ...]:
        return parse_quota(self.cost.quota, tool_name=self.name)

    @property
    def trusted(self) -> bool:
        return self.source is not ToolSource.UNTRUSTED

    @property
    def effective_effect(self) -> Effect:
        """The effect the host acts on: an untrusted tool's claim is not believed."""
        return self.effect if self.trusted else Effect.IRREVERSIBLE_EXTERNAL

    @property
    def is_read_only(self) -> bool:
        return self.effective_effect is Effect.READ_ONLY

    def model_view(self) -> dict[str, Any]:
        """The three model-visible fields, in the OpenAI `tools` format."""
        function: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.input_schema),
        }
        if _is_strict_compatible(self.input_schema):
            function["strict"] = True
        return {"type": "function", "function": function}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": dict(self.input_schema),
            "preconditions": list(self.preconditions),
            "effect": str(self.effect),
            "idempotency": str(self.idempotency),
            "cost": self.cost.to_dict(),
            "auth_scope": self.auth_scope,
            "source": str(self.source),
            "version": self.version,
            "approval": str(self.approval),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolContract:
        """Build from declared facts; unknown or missing facts become the defaults."""
        return cls(
            name=str(data["name"]),
            description=str(data.get("description", "")),
            input_schema=data["input_schema"],
            preconditions=tuple(str(p) for p in data.get("preconditions") or ()),
            effect=_coerce_enum(
                Effect, data.get("effect"), Effect.IRREVERSIBLE_EXTERNAL
            ),
            idempotency=_coerce_enum(
                Idempotency, data.get("idempotency"), Idempotency.NONE
            ),
            cost=ToolCost.from_dict(data.get("cost")),
            auth_scope=data.get("auth_scope"),
            source=_coerce_enum(ToolSource, data.get("source"), ToolSource.UNTRUSTED),
            version=str(data.get("version", "1")),
            approval=_coerce_enum(
                ApprovalNeed, data.get("approval"), ApprovalNeed.POLICY
            ),
        )


def _is_strict_compatible(schema: Any) -> bool:
    """OpenAI strict mode: every object closed and every property required."""
    if not isinstance(schema, Mapping):
        return True
    props = schema.get("properties")
    if isinstance(props, Mapping):
        if set(props) != set(schema.get("required", [])):
            return False
        if not all(_is_strict_compatible(p) for p in props.values()):
            return False
    for key in ("$defs", "patternProperties"):
        sub = schema.get(key)
        if isinstance(sub, Mapping) and not all(
            _is_strict_compatible(s) for s in sub.values()
        ):
            return False
    for key in ("items", "not", "if", "then", "else", "contains"):
        if key in schema and not _is_strict_compatible(schema[key]):
            return False
    for key in ("anyOf", "allOf", "oneOf", "prefixItems"):
        sub = schema.get(key)
        if isinstance(sub, list) and not all(_is_strict_compatible(s) for s in sub):
            return False
    return True
