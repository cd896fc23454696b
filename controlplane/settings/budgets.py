"""Budgets: default prices."""

from __future__ import annotations

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
