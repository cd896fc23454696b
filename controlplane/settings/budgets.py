"""Budgets: default prices, external agents' reservations."""

from __future__ import annotations

from controlplane.environment import env
from controlplane.settings.broker import CELERY_BEAT_SCHEDULE

# Budgets (docs/budgets.md): prices per million tokens as (input, cached input,
# output) for models with no row in the price table. A model in neither is
# `unknown price`: its tokens are counted and a run whose cost is capped is refused
# unless the tenant allows unknown prices.
BUDGET_DEFAULT_PRICES: dict[str, tuple[str, str, str]] = {
    "gpt-4o": ("2.50", "1.25", "10.00"),
    "gpt-4o-mini": ("0.15", "0.075", "0.60"),
    "gpt-4.1": ("2.00", "0.50", "8.00"),
    "gpt-4.1-mini": ("0.40", "0.10", "1.60"),
    "o4-mini": ("1.10", "0.275", "4.40"),
    "claude-sonnet-4": ("3.00", "0.30", "15.00"),
    "claude-3-5-haiku": ("0.80", "0.08", "4.00"),
}

# External agents' reservations (POST /api/v1/budget/reservations/): an open one
# is given back by beat at its `expires_at`, so a client that died holds nothing.
BUDGET_RESERVATION_DEFAULT_TTL_SECONDS = env.integer(
    "BUDGET_RESERVATION_DEFAULT_TTL_SECONDS",
    600,
    minimum=1,
    help="How long an external agent's reservation is held when it names no "
    "ttl_seconds; beat releases it after that unless settled or released.",
)
BUDGET_RESERVATION_MAX_TTL_SECONDS = env.integer(
    "BUDGET_RESERVATION_MAX_TTL_SECONDS",
    24 * 3600,
    minimum=1,
    help="The longest ttl_seconds a reservation may ask for.",
)
BUDGET_RESERVATION_EXPIRE_INTERVAL_SECONDS = env.number(
    "BUDGET_RESERVATION_EXPIRE_INTERVAL_SECONDS",
    30.0,
    minimum=1.0,
    help="How often beat releases external reservations past their expires_at.",
)
CELERY_BEAT_SCHEDULE["budgets-expire-reservations"] = {
    "task": "budgets.tasks.expire_budget_reservations_task",
    "schedule": BUDGET_RESERVATION_EXPIRE_INTERVAL_SECONDS,
}
