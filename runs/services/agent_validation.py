"""Checks of an agent version's configuration and of a model endpoint, each
problem named by the field to fix (docs/agents.md).

Shapes are checked here too, not only by the API's serializers: the demo
seeder, management commands and tests create agents through the same services.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import InvalidOperation
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import URLValidator, validate_slug

from controlplane.models import Tenant
from controlplane.secrets import secret_exists, secret_name_problem
from runs.engine.adapters.scripted import script_entry_problems
from runs.engine.budget import BudgetLimits
from runs.engine.disclosure import is_deferred, skill_problems
from runs.evaluators import EVALUATORS
from runs.models import AgentVersion, ModelEndpoint
from runs.services.guard_config import guardrails_problems, hooks_problems
from runs.services.subagent_config import subagents_problems
from runs.tools.egress import CREDENTIALS, NETWORK, egress_settings_errors
from runs.tools.registry import unknown_tool_refs

APPROVAL_CHOICES = ("policy", "always", "never")
# direct: sent to the model every turn; deferred: found through tool_search.
EXPOSURE_CHOICES = ("direct", "deferred")
EGRESS_KEYS = (NETWORK, CREDENTIALS)  # checked by runs.tools.egress
# The crash demo's switches, for create_replacement only (docs/demo.md).
DEMO_SWITCH_KEYS = ("idempotency_keys", "crash_after_effect")
TOOL_SETTING_KEYS = ("approval", "exposure", *EGRESS_KEYS, *DEMO_SWITCH_KEYS)
# Refs in all; the tools sent every turn are fewer (selection degrades past a
# few dozen definitions: spec §2.1 ch. 5), the rest are deferred.
MAX_TOOLS = 1000
MAX_DIRECT_TOOLS = 200
MAX_MODELS = 50
MAX_PROMPT_CHARS = 100_000
MAX_SCRIPT_REPLIES = 1_000


class DefinitionError(ValueError):
    """An agent or endpoint definition is invalid; a message per field. Nothing
    was written."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {', '.join(v)}" for k, v in fields.items()))
        self.fields = fields


class Problems:
    def __init__(self) -> None:
        self.fields: dict[str, list[str]] = {}

    def add(self, field: str, message: str) -> None:
        self.fields.setdefault(field, []).append(message)

    def raise_any(self) -> None:
        if self.fields:
            raise DefinitionError(self.fields)


def _text(
    problems: Problems, field: str, value: Any, *, limit: int, required: bool
) -> str:
    if not isinstance(value, str):
        problems.add(field, "must be a string")
        return ""
    if required and not value.strip():
        problems.add(field, "may not be blank")
    if len(value) > limit:
        problems.add(field, f"has {len(value)} characters; at most {limit}")
    return value


def _tool_settings(
    problems: Problems, value: Any, tools: list[str], tenant: Tenant
) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict):
        problems.add("tool_settings", "must be an object: tool ref -> settings")
        return {}
    for ref, settings in value.items():
        where = f"tool_settings[{ref}]"
        if ref not in tools:
            problems.add("tool_settings", f"{ref!r} is not one of the agent's tools")
            continue
        if not isinstance(settings, dict):
            problems.add("tool_settings", f"{where} must be an object")
            continue
        for key in sorted(set(settings) - set(TOOL_SETTING_KEYS)):
            hint = (
                "quotas come from the tool's contract (cost.quota)"
                if key == "quota"
                else f"known keys: {', '.join(TOOL_SETTING_KEYS)}"
            )
            problems.add("tool_settings", f"{where}: unknown key {key!r}; {hint}")
        approval = settings.get("approval", "policy")
        if approval not in APPROVAL_CHOICES:
            problems.add(
                "tool_settings",
                f"{where}.approval must be one of {', '.join(APPROVAL_CHOICES)}",
            )
        if settings.get("exposure", "direct") not in EXPOSURE_CHOICES:
            problems.add(
                "tool_settings",
                f"{where}.exposure must be one of {', '.join(EXPOSURE_CHOICES)}",
            )
        for key in DEMO_SWITCH_KEYS:
            if key not in settings:
                continue
            if ref != "create_replacement":
                problems.add(
                    "tool_settings", f"{where}.{key} applies to create_replacement only"
                )
            elif not isinstance(settings[key], bool):
                problems.add("tool_settings", f"{where}.{key} must be true or false")
        for path, why in egress_settings_errors(
            {k: v for k, v in settings.items() if k in EGRESS_KEYS},
            field=where,
            tenant_id=tenant.pk,
        ).items():
            problems.add("tool_settings", f"{path}: {why}")
    return value


def _string_list(problems: Problems, field: str, value: Any, limit: int) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.add(field, "must be a list of strings")
        return []
    if len(value) > limit:
        problems.add(field, f"has {len(value)} entries; at most {limit}")
    if len(set(value)) != len(value):
        problems.add(field, "lists an entry twice")
    for item in value:
        if not item.strip() or len(item) > 200:
            problems.add(field, f"{item!r} must be 1-200 characters")
    return value


def _endpoint(
    problems: Problems, field: str, value: Any, tenant: Tenant
) -> ModelEndpoint | None:
    if isinstance(value, ModelEndpoint):
        value = value.slug
    if not isinstance(value, str):
        problems.add(field, "must be a model endpoint's slug")
        return None
    found = ModelEndpoint.objects.filter(tenant=tenant, slug=value).first()
    if found is None:
        problems.add(field, f"no model endpoint {value!r} in this tenant")
    return found


def version_config_of(version: AgentVersion) -> dict[str, Any]:
    """The version's configuration as an API client writes it (endpoints by slug)."""
    return {
        "name": version.name,
        "endpoint": version.endpoint.slug,
        "model": version.model,
        "fallback_endpoint": (
            version.fallback_endpoint.slug if version.fallback_endpoint else None
        ),
        "fallback_model": version.fallback_model,
        "evaluated_models": list(version.evaluated_models),
        "system_prompt": version.system_prompt,
        "skills": [dict(skill) for skill in version.skills],
        "tools": list(version.tools),
        "tool_settings": dict(version.tool_settings),
        "default_limits": dict(version.default_limits),
        "evaluator": version.evaluator,
        "script": list(version.script),
        "guardrails": list(version.guardrails),
        "hooks": list(version.hooks),
        "compaction_threshold": version.compaction_threshold,
        "subagents": [dict(entry) for entry in version.subagents],
    }


# The share of the model's window above which the context is compacted: below
# 0.2 a run would summarise all the time; above 0.95 the reply has no room.
DEFAULT_COMPACTION_THRESHOLD = 0.8
MIN_COMPACTION_THRESHOLD = 0.2
MAX_COMPACTION_THRESHOLD = 0.95

CONFIG_DEFAULTS: dict[str, Any] = {
    "fallback_endpoint": None,
    "fallback_model": "",
    "evaluated_models": [],
    "system_prompt": "",
    "skills": [],
    "tools": [],
    "tool_settings": {},
    "default_limits": {},
    "evaluator": "",
    "script": [],
    "guardrails": [],
    "hooks": [],
    "compaction_threshold": DEFAULT_COMPACTION_THRESHOLD,
    "subagents": [],
}
REQUIRED_CONFIG = ("name", "endpoint", "model")


def agent_config_validate(
    *,
    tenant: Tenant,
    data: Mapping[str, Any],
    base: Mapping[str, Any] | None = None,
    agent_slug: str = "",
) -> dict[str, Any]:
    """The fields of a new AgentVersion from `data` over `base` (the current
    configuration, for a partial edit); DefinitionError names every problem.
    `agent_slug`: the agent's, for the sub-agent cycle check."""
    problems = Problems()
    unknown = sorted(set(data) - set(AgentVersion.CONFIG_FIELDS))
    for field in unknown:
        problems.add(field, "unknown field")
    merged = {**CONFIG_DEFAULTS, **(base or {})}
    merged.update({k: v for k, v in data.items() if k in AgentVersion.CONFIG_FIELDS})
    for field in REQUIRED_CONFIG:
        if field not in merged:
            problems.add(field, "this field is required")
    problems.raise_any()
    out: dict[str, Any] = {
        "name": _text(problems, "name", merged["name"], limit=200, required=True),
        "model": _text(problems, "model", merged["model"], limit=200, required=True),
        "system_prompt": _text(
            problems,
            "system_prompt",
            merged["system_prompt"],
            limit=MAX_PROMPT_CHARS,
            required=False,
        ),
        "fallback_model": _text(
            problems,
            "fallback_model",
            merged["fallback_model"] or "",
            limit=200,
            required=False,
        ),
        "evaluator": _text(
            problems, "evaluator", merged["evaluator"] or "", limit=100, required=False
        ),
    }
    out["endpoint"] = _endpoint(problems, "endpoint", merged["endpoint"], tenant)
    out["fallback_endpoint"] = None
    if merged["fallback_endpoint"] not in (None, ""):
        out["fallback_endpoint"] = _endpoint(
            problems, "fallback_endpoint", merged["fallback_endpoint"], tenant
        )
    out["evaluated_models"] = _string_list(
        problems, "evaluated_models", merged["evaluated_models"], MAX_MODELS
    )
    if out["fallback_endpoint"] is not None and not out["fallback_model"]:
        problems.add("fallback_model", "a fallback endpoint needs a fallback model")
    if out["fallback_model"] and out["fallback_model"] not in out["evaluated_models"]:
        problems.add(
            "fallback_model",
            f"{out['fallback_model']!r} is not in evaluated_models: a fallback "
            "must be a model the agent was evaluated with",
        )
    tools = _string_list(problems, "tools", merged["tools"], MAX_TOOLS)
    if tools and (unknown_refs := unknown_tool_refs(tools, tenant_id=tenant.pk)):
        problems.add("tools", f"unknown tools: {', '.join(unknown_refs)}")
    out["tools"] = tools
    out["tool_settings"] = _tool_settings(
        problems, merged["tool_settings"], tools, tenant
    )
    crashing = out["tool_settings"].get("create_replacement", {})
    endpoint = out["endpoint"]
    if crashing.get("crash_after_effect") is True and (
        endpoint is not None and endpoint.kind != ModelEndpoint.Kind.SCRIPTED
    ):
        # It kills the worker that ran the call: a demo of recovery, never a
        # setting of an agent that serves customers.
        problems.add(
            "tool_settings",
            "tool_settings[create_replacement].crash_after_effect is the crash "
            "demo's switch: only an agent on a scripted endpoint may set it",
        )
    direct = [r for r in tools if not is_deferred(out["tool_settings"].get(r))]
    if len(direct) > MAX_DIRECT_TOOLS:
        problems.add(
            "tools",
            f"{len(direct)} tools are sent every turn; at most {MAX_DIRECT_TOOLS}: "
            'expose the others "deferred" (tool_settings[ref].exposure)',
        )
    for why in skill_problems(merged["skills"]):
        problems.add("skills", why)
    out["skills"] = merged["skills"]
    limits = merged["default_limits"]
    try:
        if not isinstance(limits, dict):
            raise ValueError('must be an object of caps, e.g. {"max_steps": 20}')
        BudgetLimits.from_dict(limits)
    except (ValueError, TypeError, ArithmeticError, InvalidOperation) as exc:
        problems.add("default_limits", str(exc))
    out["default_limits"] = limits
    if out["evaluator"] and out["evaluator"] not in EVALUATORS:
        problems.add(
            "evaluator",
            f"no evaluator {out['evaluator']!r}; known: {', '.join(EVALUATORS)}",
        )
    script = merged["script"]
    if not isinstance(script, list) or not all(isinstance(r, dict) for r in script):
        problems.add("script", "must be a list of reply objects")
    elif len(script) > MAX_SCRIPT_REPLIES:
        problems.add("script", f"has {len(script)} replies; at most 1000")
    else:  # a reply the scripted model cannot read fails here, not at the run
        for index, entry in enumerate(script):
            for why in script_entry_problems(entry, f"script[{index}]")[:5]:
                problems.add("script", why)
    out["script"] = script
    for why in guardrails_problems(merged["guardrails"], tenant_id=tenant.pk):
        problems.add("guardrails", why)
    out["guardrails"] = merged["guardrails"]
    for why in hooks_problems(merged["hooks"]):
        problems.add("hooks", why)
    out["hooks"] = merged["hooks"]
    threshold = merged["compaction_threshold"]
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        problems.add("compaction_threshold", "must be a number")
    elif not MIN_COMPACTION_THRESHOLD <= threshold <= MAX_COMPACTION_THRESHOLD:
        problems.add(
            "compaction_threshold",
            f"must be between {MIN_COMPACTION_THRESHOLD} and "
            f"{MAX_COMPACTION_THRESHOLD} (a share of the model's context window)",
        )
    out["compaction_threshold"] = threshold
    subagents, why_not = subagents_problems(
        tenant=tenant, agent_slug=agent_slug, value=merged["subagents"]
    )
    for why in why_not:
        problems.add("subagents", why)
    out["subagents"] = subagents
    problems.raise_any()
    return out


def slug_problem(value: Any) -> str | None:
    if not isinstance(value, str) or not 1 <= len(value) <= 64:
        return "must be a slug of 1-64 characters"
    try:
        validate_slug(value)
    except DjangoValidationError:
        return "may hold only letters, digits, hyphens and underscores"
    return None


def _positive_number(limit: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "must be a number"
        if not 0 < value <= limit:
            return f"must be above 0 and at most {limit}"
        return None

    return check


def _int_between(low: int, high: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return "must be an integer"
        if not low <= value <= high:
            return f"must be between {low} and {high}"
        return None

    return check


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


# Each option an endpoint may set, with its check (runs.runtime passes the ones
# the adapters take).
ENDPOINT_OPTIONS: dict[str, Callable[[Any], str | None]] = {
    "timeout_seconds": _positive_number(600),
    "max_retries": _int_between(0, 10),
    "stream": _boolean,
    # The endpoint's circuit breaker (runs.model_routing).
    "breaker_failures": _int_between(1, 100),
    "breaker_cooldown_seconds": _positive_number(3600),
}


def endpoint_validate(
    *,
    tenant: Tenant,
    data: Mapping[str, Any],
    instance: ModelEndpoint | None = None,
    partial: bool = False,
) -> dict[str, Any]:
    """The endpoint's fields from `data`; `instance`: the endpoint edited (over
    whose fields a `partial` edit's data goes)."""
    problems = Problems()
    known = ("slug", "name", "kind", "base_url", "api_key_secret", "options")
    for field in sorted(set(data) - set(known)):
        problems.add(field, "unknown field")
    base: dict[str, Any] = {"base_url": "", "api_key_secret": "", "options": {}}
    if instance is not None and partial:
        base = {name: getattr(instance, name) for name in known}
    merged = {**base, **{k: v for k, v in data.items() if k in known}}
    for field in ("slug", "name", "kind"):
        if field not in merged:
            problems.add(field, "this field is required")
    problems.raise_any()
    same_slug = ModelEndpoint.objects.filter(tenant=tenant, slug=merged["slug"])
    if instance is not None:
        same_slug = same_slug.exclude(pk=instance.pk)
    if (why := slug_problem(merged["slug"])) is not None:
        problems.add("slug", why)
    elif same_slug.exists():
        problems.add("slug", f"this tenant has an endpoint {merged['slug']!r}")
    _text(problems, "name", merged["name"], limit=200, required=True)
    kind = merged["kind"]
    if kind not in ModelEndpoint.Kind.values:
        problems.add("kind", f"must be one of {', '.join(ModelEndpoint.Kind.values)}")
    base_url = _text(
        problems, "base_url", merged["base_url"], limit=500, required=False
    )
    if base_url and kind == ModelEndpoint.Kind.SCRIPTED:
        problems.add("base_url", "a scripted endpoint has no URL")
    elif base_url:
        try:
            URLValidator(schemes=["http", "https"])(base_url)
        except DjangoValidationError:
            problems.add("base_url", "must be an http(s) URL")
        else:
            # The URL is shown to every member and recorded on spans: a key
            # belongs in the secret store.
            if "@" in urlsplit(base_url).netloc:
                problems.add(
                    "base_url",
                    "put credentials in a secret (api_key_secret), not in the URL",
                )
    secret = merged["api_key_secret"]
    if secret not in ("", None) and (why := secret_name_problem(secret)):
        problems.add("api_key_secret", why)
    elif secret and not secret_exists(tenant_id=tenant.pk, name=secret):
        problems.add(
            "api_key_secret",
            f"secret {secret!r} is not set in this tenant; set it on the Secrets "
            "page first",
        )
    merged["api_key_secret"] = secret or ""
    options = merged["options"]
    if not isinstance(options, dict):
        problems.add("options", "must be an object")
    else:
        for name, value in options.items():
            check = ENDPOINT_OPTIONS.get(name)
            if check is None:
                problems.add(
                    "options",
                    f"unknown option {name!r}; known: {', '.join(ENDPOINT_OPTIONS)}",
                )
            elif (why := check(value)) is not None:
                problems.add("options", f"{name} {why}")
    problems.raise_any()
    return {name: merged[name] for name in known}
