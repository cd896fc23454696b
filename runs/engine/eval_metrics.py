"""Eval statistics: pass@1, pass@k, pass^k per case and per suite, with an interval.

A case is run n times (trials); c of them pass every grader. Per case:

- pass@1 = c / n, the single-trial success probability.
- pass@k = 1 - C(n-c, k) / C(n, k), the unbiased estimator of "at least one of k
  trials passes" (Chen et al. 2021, the Codex paper); it measures the ceiling.
- pass^k = C(c, k) / C(n, k), the unbiased estimator of "all k trials pass"
  (tau-bench); it measures stability, which is what production cares about.

1 <= k <= n. Suite figures are the unweighted mean over cases, so a case run more
often does not count for more. Cost, tokens, steps and latency are means per trial.

The interval for suite pass@1 respects clustering: trials of one case are not
independent (a case the agent cannot do fails every trial), so treating the
cases x trials outcomes as independent coin flips gives an interval far too narrow.
We use a Wilson score interval on the suite pass@1 with Kish's effective sample size
n_eff = p(1-p) / SE^2, where SE is the cluster (case-level) standard error of the
mean of the case pass@1 values: SE^2 = sum((p_i - p)^2) / (m (m - 1)) over m cases.
n_eff is capped at the number of trials (clustering never adds information) and,
when SE cannot be estimated (one case, or every trial passed or every trial failed),
is the number of cases: each case then counts as one observation. Wilson rather than
p +- z SE because it stays inside [0, 1] and does not collapse to a point at 0 or 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from statistics import NormalDist

DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class TrialOutcome:
    """One trial of one case: did every grader pass, and what it cost."""

    case_id: str
    passed: bool
    cost: Decimal
    tokens: int
    steps: int
    latency_ms: float
    # The graders' reasons when the trial failed, shown in reports and JUnit.
    reasons: tuple[str, ...] = ()
    trial_id: str = ""


@dataclass(frozen=True)
class Interval:
    """A two-sided confidence interval."""

    low: float
    high: float
    confidence: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: the chance at least one of k trials drawn from n passes."""
    _check_counts(n, c, k)
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k: the chance all k trials drawn from n pass."""
    _check_counts(n, c, k)
    return float(Fraction(math.comb(c, k), math.comb(n, k)))


def _check_counts(n: int, c: int, k: int) -> None:
    if n < 1:
        raise ValueError(f"n={n}: a case needs at least one trial")
    if not 0 <= c <= n:
        raise ValueError(f"c={c}: passed trials must be between 0 and n={n}")
    if k < 1:
        raise ValueError(f"k={k}: k must be at least 1")
    if k > n:
        raise ValueError(f"k={k} is more than the n={n} trials run")


def z_value(confidence: float) -> float:
    """The two-sided normal quantile for a confidence level in (0, 1)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence}: must be between 0 and 1")
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def wilson_interval(p: float, n: float, confidence: float) -> Interval:
    """Wilson score interval for a proportion p over n (possibly fractional) trials."""
    if n <= 0:
        raise ValueError(f"n={n}: the interval needs a positive sample size")
    z = z_value(confidence)
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(max(p * (1 - p) / n + z * z / (4 * n * n), 0))
    return Interval(max(0.0, centre - half), min(1.0, centre + half), confidence)


@dataclass(frozen=True)
class CaseSummary:
    """One case's figures over its trials."""

    case_id: str
    k: int
    n: int
    c: int
    pass_at_1: float
    pass_at_k: float
    pass_hat_k: float
    mean_cost: Decimal
    mean_tokens: float
    mean_steps: float
    mean_latency_ms: float
    trials: tuple[TrialOutcome, ...]

    @property
    def failed_trials(self) -> tuple[TrialOutcome, ...]:
        return tuple(t for t in self.trials if not t.passed)

    @property
    def total_latency_ms(self) -> float:
        return sum(t.latency_ms for t in self.trials)

    def pass_at(self, k: int) -> float:
        """pass@k for another k (a comparison uses the smaller k of two runs)."""
        return pass_at_k(self.n, self.c, k)

    def pass_hat(self, k: int) -> float:
        return pass_hat_k(self.n, self.c, k)


@dataclass(frozen=True)
class SuiteSummary:
    """A suite's figures: means over cases, cost and the like per trial."""

    k: int
    cases: tuple[CaseSummary, ...]
    trials: int
    pass_at_1: float
    pass_at_k: float
    pass_hat_k: float
    pass_at_1_interval: Interval
    # Kish's effective number of independent trials behind the interval.
    effective_trials: float
    mean_cost: Decimal
    total_cost: Decimal
    mean_tokens: float
    mean_steps: float
    mean_latency_ms: float

    def case(self, case_id: str) -> CaseSummary:
        for case in self.cases:
            if case.case_id == case_id:
                return case
        raise KeyError(case_id)


def summarise_case(case_id: str, trials: Sequence[TrialOutcome], k: int) -> CaseSummary:
    """Figures for one case from its trials (all of which must belong to it)."""
    if not trials:
        raise ValueError(f"n=0: case {case_id!r} has no trials")
    strangers = {t.case_id for t in trials} - {case_id}
    if strangers:
        raise ValueError(f"trials of {sorted(strangers)} given for case {case_id!r}")
    n = len(trials)
    c = sum(1 for t in trials if t.passed)
    try:
        at_k, hat_k = pass_at_k(n, c, k), pass_hat_k(n, c, k)
    except ValueError as exc:
        raise ValueError(f"case {case_id!r}: {exc}") from None
    return CaseSummary(
        case_id=case_id,
        k=k,
        n=n,
        c=c,
        pass_at_1=c / n,
        pass_at_k=at_k,
        pass_hat_k=hat_k,
        mean_cost=sum((t.cost for t in trials), Decimal(0)) / n,
        mean_tokens=sum(t.tokens for t in trials) / n,
        mean_steps=sum(t.steps for t in trials) / n,
        mean_latency_ms=sum(t.latency_ms for t in trials) / n,
        trials=tuple(trials),
    )


def summarise_suite(
    trials: Iterable[TrialOutcome], *, k: int, confidence: float = DEFAULT_CONFIDENCE
) -> SuiteSummary:
    """Suite figures from every trial of every case; cases keep first-seen order."""
    by_case: dict[str, list[TrialOutcome]] = {}
    for trial in trials:
        by_case.setdefault(trial.case_id, []).append(trial)
    if not by_case:
        raise ValueError("a suite summary needs at least one case with trials")
    cases = tuple(summarise_case(cid, ts, k) for cid, ts in by_case.items())
    every = [t for case in cases for t in case.trials]
    total_cost = sum((t.cost for t in every), Decimal(0))
    p = _mean([case.pass_at_1 for case in cases])
    n_eff = clustered_effective_trials([case.pass_at_1 for case in cases], len(every))
    return SuiteSummary(
        k=k,
        cases=cases,
        trials=len(every),
        pass_at_1=p,
        pass_at_k=_mean([case.pass_at_k for case in cases]),
        pass_hat_k=_mean([case.pass_hat_k for case in cases]),
        pass_at_1_interval=wilson_interval(p, n_eff, confidence),
        effective_trials=n_eff,
        mean_cost=total_cost / len(every),
        total_cost=total_cost,
        mean_tokens=_mean([float(t.tokens) for t in every]),
        mean_steps=_mean([float(t.steps) for t in every]),
        mean_latency_ms=_mean([t.latency_ms for t in every]),
    )


def clustered_effective_trials(case_rates: Sequence[float], trials: int) -> float:
    """Kish's effective sample size for the mean of case pass rates (see module doc)."""
    m = len(case_rates)
    p = _mean(case_rates)
    if m < 2 or p in (0.0, 1.0):
        return float(m)
    variance_of_mean = sum((r - p) ** 2 for r in case_rates) / (m * (m - 1))
    if variance_of_mean == 0:
        # Every case has the same rate: nothing between cases adds noise, so the
        # trials are the sample (the plain binomial interval).
        return float(trials)
    return min(max(p * (1 - p) / variance_of_mean, 1.0), float(trials))


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)
