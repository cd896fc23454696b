"""An agent version's guardrails and hooks: checking their configuration (each
problem named by its place, e.g. `guardrails[0].params.patterns`) and reading
it back for a run. The checks themselves are in runs.engine.guardrails/.hooks.

Hook types are the built-in ones plus those an operator installs for the whole
deployment (settings.RUN_EXTRA_HOOK_TYPES: dotted paths of mappings name ->
HookType), never code an agent's editor supplies.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from runs.engine.guarding import ParamError
from runs.engine.guardrails import (
    MAX_GUARDRAILS,
    GuardrailSpec,
    guardrail_from_dict,
)
from runs.engine.hooks import (
    HOOK_TYPES,
    MAX_HOOKS,
    HookEvent,
    HookSpec,
    HookType,
    hook_from_dict,
)
from runs.models import AgentVersion, ModelEndpoint

__all__ = [
    "guardrails_of",
    "guardrails_problems",
    "hook_types",
    "hooks_of",
    "hooks_problems",
]


def hook_types() -> dict[str, HookType]:
    types = dict(HOOK_TYPES)
    for path in settings.RUN_EXTRA_HOOK_TYPES:
        types.update(import_string(path))
    return types


def guardrails_problems(value: Any, *, tenant_id: Any) -> list[str]:
    if not isinstance(value, list):
        return ["must be a list of guardrails"]
    if len(value) > MAX_GUARDRAILS:
        return [f"has {len(value)} guardrails; at most {MAX_GUARDRAILS}"]
    problems: list[str] = []
    names: set[tuple[str, str]] = set()
    for index, item in enumerate(value):
        where = f"guardrails[{index}]"
        try:
            spec = guardrail_from_dict(item)
        except ParamError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if (spec.name, spec.stage) in names:
            problems.append(f"{where}: a second {spec.stage} guardrail {spec.name!r}")
        names.add((spec.name, spec.stage))
        if spec.endpoint:
            endpoint = ModelEndpoint.objects.filter(
                tenant_id=tenant_id, slug=spec.endpoint
            ).first()
            if endpoint is None:
                problems.append(
                    f"{where}.endpoint: no model endpoint {spec.endpoint!r} in this "
                    "tenant"
                )
            elif spec.script and endpoint.kind != ModelEndpoint.Kind.SCRIPTED:
                problems.append(f"{where}.script: only a scripted endpoint has one")
    return problems


def hooks_problems(value: Any) -> list[str]:
    if not isinstance(value, list):
        return ["must be a list of hooks"]
    if len(value) > MAX_HOOKS:
        return [f"has {len(value)} hooks; at most {MAX_HOOKS}"]
    types = hook_types()
    problems: list[str] = []
    for index, item in enumerate(value):
        try:
            hook_from_dict(item, types)
        except ParamError as exc:
            problems.append(f"hooks[{index}]: {exc}")
    return problems


def guardrails_of(version: AgentVersion) -> list[GuardrailSpec]:
    """The version's guardrails (checked when it was written)."""
    return [guardrail_from_dict(item) for item in version.guardrails or ()]


def hooks_of(version: AgentVersion) -> list[HookSpec]:
    """The version's hooks; one whose type an operator uninstalled since is kept
    as a hook that fails (and so blocks) when it runs."""
    types = hook_types()
    hooks: list[HookSpec] = []
    for item in version.hooks or ():
        try:
            hooks.append(hook_from_dict(item, types))
        except ParamError:  # fails at the run's start, so the run never goes on
            hooks.append(HookSpec(str(item.get("type")), HookEvent.RUN_STARTED, {}))
    return hooks
