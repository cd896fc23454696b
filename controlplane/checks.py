"""System checks: configuration problems surface with a hint, not as tracebacks."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from controlplane import redis_probe, secret_keys


@register()
def environment_values(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    return [
        Error(
            f"Environment variable {name}: {problem}.",
            hint=f"Fix or unset {name}; the README lists every variable.",
            id="controlplane.E001",
        )
        for name, problem in settings.ENV_PROBLEMS
    ]


@register(deploy=False)
def production_secret_key(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    if not settings.DEBUG and settings.SECRET_KEY == settings.INSECURE_DEV_SECRET_KEY:
        return [
            Error(
                "DEBUG is false but SECRET_KEY is the insecure development key.",
                hint="Set SECRET_KEY to a long random value, e.g. "
                "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`.",
                id="controlplane.E002",
            )
        ]
    if not settings.DEBUG and len(settings.SECRET_KEY) < 32:
        return [
            Warning(
                "SECRET_KEY is shorter than 32 characters.",
                hint="Use a long random value.",
                id="controlplane.W002",
            )
        ]
    return []


@register()
def redis_reachable(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    if not settings.REDIS_URL:
        return []  # embedded: `manage.py dev` starts it and exports REDIS_URL
    problem = redis_probe.redis_problem(settings.REDIS_URL, timeout=0.5)
    if problem is None:
        return []
    return [
        Warning(
            f"Redis at REDIS_URL is not reachable: {problem}",
            hint="Start Redis, fix REDIS_URL, or unset it so `make run` starts the "
            "embedded Redis. Workers, live updates and /healthz need it.",
            id="controlplane.W003",
        )
    ]


@register()
def model_deadline_inside_lease(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    deadline, lease = settings.RUN_MODEL_DEADLINE_SECONDS, settings.RUN_LEASE_SECONDS
    if deadline < lease:
        return []
    return [
        Warning(
            f"RUN_MODEL_DEADLINE_SECONDS ({deadline:g}) is not below "
            f"RUN_LEASE_SECONDS ({lease:g}).",
            hint="A worker renews its lease while a model call runs; if its "
            "renewals fail, a call that outlasts the lease may be asked again by "
            "another worker. Lower the deadline or raise the lease.",
            id="controlplane.W004",
        )
    ]


@register()
def secret_store_keys(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """A store without a usable key would refuse every secret at run time."""
    messages: list[CheckMessage] = [
        Error(
            f"Secret store: {problem}.",
            hint=secret_keys.HINT,
            id="controlplane.E010",
        )
        for problem in secret_keys.key_problems()
    ]
    messages += [
        Warning(
            f"Secret store: {problem}.",
            hint="chmod 600 it, or set CONTROLPLANE_SECRET_KEYS.",
            id="controlplane.W010",
        )
        for problem in secret_keys.dev_key_file_warnings()
    ]
    return messages
