"""Builders of eval trial outcomes for the eval statistics tests."""

from __future__ import annotations

from decimal import Decimal

from runs.engine.eval_metrics import TrialOutcome


def trials(
    case_id: str,
    n: int,
    passed: int,
    *,
    cost: str = "0.01",
    tokens: int = 100,
    steps: int = 3,
    latency_ms: float = 1000.0,
    reason: str = "did not call get_delivery_date",
) -> list[TrialOutcome]:
    """n trials of one case, the first `passed` of which passed."""
    return [
        TrialOutcome(
            case_id=case_id,
            passed=i < passed,
            cost=Decimal(cost),
            tokens=tokens,
            steps=steps,
            latency_ms=latency_ms,
            reasons=() if i < passed else (reason,),
            trial_id=f"{case_id}-{i + 1}",
        )
        for i in range(n)
    ]


def suite_trials(*cases: tuple[int, int], prefix: str = "case") -> list[TrialOutcome]:
    """Trials of cases given as (n, passed) pairs, named case0, case1, ..."""
    return [t for i, (n, c) in enumerate(cases) for t in trials(f"{prefix}{i}", n, c)]
