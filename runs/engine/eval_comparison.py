"""Comparing two eval runs of one suite, paired by case.

Only cases present in both runs are compared (cases added or removed are listed
apart), and every figure is the unweighted mean over those paired cases, so a delta
is the mean of per-case differences d_i = after_i - before_i.

A case **flips** when its pass@1 moves by at least `flip_threshold` (default 0.5, a
majority of its trials): down is `regressed` ("passed -> failed"), up is `fixed`.
With one trial per case that is exactly pass becoming fail; a threshold of 1 means
only "every trial passed" becoming "every trial failed".

The interval of a delta is paired and case-level: d +- z SE with
SE^2 = var(d_i) / m over m paired cases. Because a handful of cases rarely shows all
the trial-to-trial noise (a suite whose cases all pass twice has var(d_i) = 0), the
pass-rate deltas use the larger of that SE and a trial-level floor,
SE_floor^2 = sum(q_a(1-q_a)/n_a + q_b(1-q_b)/n_b) / m^2 with Laplace-smoothed case
rates q = (c+1)/(n+2), which is never zero.

The **minimum detectable difference** (MDD) is the true pass@1 change this sample
would detect at the given confidence (two-sided) and power:
MDD = (z_(1-alpha/2) + z_power) SE, with 95% and 80% by default. When the observed
delta is smaller than the MDD the comparison carries a warning saying so, with the
MDD and the number of cases that would show the observed delta (SE shrinks as
1/sqrt(m), so m (MDD / |delta|)^2 cases at the same trials per case).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from statistics import NormalDist

from runs.engine.eval_metrics import (
    DEFAULT_CONFIDENCE,
    CaseSummary,
    Interval,
    SuiteSummary,
    z_value,
)

DEFAULT_POWER = 0.8
DEFAULT_FLIP_THRESHOLD = 0.5
# Float noise in c/n differences must not decide whether a case flipped.
_TOLERANCE = 1e-9


class Flip(StrEnum):
    REGRESSED = "regressed"  # passed -> failed
    FIXED = "fixed"  # failed -> passed


@dataclass(frozen=True)
class CaseFlip:
    case_id: str
    direction: Flip
    before: float  # the case's pass@1 in the first run
    after: float


@dataclass(frozen=True)
class MetricDelta:
    """after - before for one metric; interval None when one case cannot show it."""

    metric: str
    before: float
    after: float
    delta: float
    interval: Interval | None


@dataclass(frozen=True)
class SuiteComparison:
    k: int
    confidence: float
    power: float
    flip_threshold: float
    cases_compared: tuple[str, ...]
    cases_added: tuple[str, ...]
    cases_removed: tuple[str, ...]
    trials_per_case: int  # the fewest trials any compared case had in either run
    flips: tuple[CaseFlip, ...]
    pass_at_1: MetricDelta
    pass_at_k: MetricDelta
    pass_hat_k: MetricDelta
    cost: MetricDelta
    latency_ms: MetricDelta
    tokens: MetricDelta
    steps: MetricDelta
    minimum_detectable_difference: float
    warning: str | None

    @property
    def regressions(self) -> tuple[CaseFlip, ...]:
        return tuple(f for f in self.flips if f.direction is Flip.REGRESSED)

    @property
    def fixes(self) -> tuple[CaseFlip, ...]:
        return tuple(f for f in self.flips if f.direction is Flip.FIXED)


def compare_suites(
    before: SuiteSummary,
    after: SuiteSummary,
    *,
    k: int | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    power: float = DEFAULT_POWER,
    flip_threshold: float = DEFAULT_FLIP_THRESHOLD,
) -> SuiteComparison:
    """Pair two runs of a suite by case; k defaults to the smaller of their ks."""
    if not 0 < flip_threshold <= 1:
        raise ValueError(f"flip_threshold={flip_threshold}: must be in (0, 1]")
    z_value(confidence)  # validates before any work
    power_z = _power_z(power)
    k = min(before.k, after.k) if k is None else k
    after_by_id = {case.case_id: case for case in after.cases}
    after_ids = after_by_id.keys()
    before_ids = {case.case_id for case in before.cases}
    pairs = [
        (b, after_by_id[b.case_id]) for b in before.cases if b.case_id in after_ids
    ]
    if not pairs:
        raise ValueError("the two eval runs have no case in common")
    for b, a in pairs:
        if k > min(b.n, a.n):
            raise ValueError(
                f"k={k} is more than the {min(b.n, a.n)} trials case "
                f"{b.case_id!r} had in one of the runs"
            )
    floor = _trial_level_se(pairs)

    def delta(
        metric: str, of: Callable[[CaseSummary], float], se_floor: float = 0.0
    ) -> MetricDelta:
        return _paired_delta(metric, pairs, of, confidence, se_floor)

    at_1 = delta("pass@1", lambda c: c.pass_at_1, floor)
    m = len(pairs)
    se = max(_paired_se([a.pass_at_1 - b.pass_at_1 for b, a in pairs]), floor)
    mdd = (z_value(confidence) + power_z) * se
    trials = min(min(b.n, a.n) for b, a in pairs)
    return SuiteComparison(
        k=k,
        confidence=confidence,
        power=power,
        flip_threshold=flip_threshold,
        cases_compared=tuple(b.case_id for b, _ in pairs),
        cases_added=tuple(
            c.case_id for c in after.cases if c.case_id not in before_ids
        ),
        cases_removed=tuple(
            c.case_id for c in before.cases if c.case_id not in after_ids
        ),
        trials_per_case=trials,
        flips=_flips(pairs, flip_threshold),
        pass_at_1=at_1,
        pass_at_k=delta("pass@k", lambda c: c.pass_at(k), floor),
        pass_hat_k=delta("pass^k", lambda c: c.pass_hat(k), floor),
        cost=delta("cost", lambda c: float(c.mean_cost)),
        latency_ms=delta("latency_ms", lambda c: c.mean_latency_ms),
        tokens=delta("tokens", lambda c: c.mean_tokens),
        steps=delta("steps", lambda c: c.mean_steps),
        minimum_detectable_difference=mdd,
        warning=sample_size_warning(
            cases=m, trials=trials, delta=at_1.delta, detectable=mdd
        ),
    )


def minimum_detectable_difference(
    standard_error: float,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    power: float = DEFAULT_POWER,
) -> float:
    """The smallest true difference a test at `confidence` detects with `power`."""
    return (z_value(confidence) + _power_z(power)) * standard_error


def sample_size_warning(
    *, cases: int, trials: int, delta: float, detectable: float
) -> str | None:
    """Why `cases` x `trials` cannot support a pass@1 change of `delta`, or None."""
    if delta == 0 or abs(delta) >= detectable:
        return None
    direction = "gain" if delta > 0 else "drop"
    needed = _round_up_2_significant(math.ceil(cases * (detectable / delta) ** 2))
    return (
        f"{cases} cases × {trials} trials cannot show a {_points(abs(delta))}-point "
        f"{direction} (it would need about {_points(detectable)} points "
        f"or {needed:,} cases)"
    )


def _flips(
    pairs: Sequence[tuple[CaseSummary, CaseSummary]], threshold: float
) -> tuple[CaseFlip, ...]:
    flips = []
    for b, a in pairs:
        change = a.pass_at_1 - b.pass_at_1
        if change <= -threshold + _TOLERANCE:
            flips.append(CaseFlip(b.case_id, Flip.REGRESSED, b.pass_at_1, a.pass_at_1))
        elif change >= threshold - _TOLERANCE:
            flips.append(CaseFlip(b.case_id, Flip.FIXED, b.pass_at_1, a.pass_at_1))
    return tuple(flips)


def _paired_delta(
    metric: str,
    pairs: Sequence[tuple[CaseSummary, CaseSummary]],
    of: Callable[[CaseSummary], float],
    confidence: float,
    se_floor: float,
) -> MetricDelta:
    befores = [of(b) for b, _ in pairs]
    afters = [of(a) for _, a in pairs]
    differences = [x - y for x, y in zip(afters, befores, strict=True)]
    mean_delta = math.fsum(differences) / len(differences)
    se = max(_paired_se(differences), se_floor)
    interval = None
    if len(differences) >= 2 or se_floor > 0:
        z = z_value(confidence)
        low, high = mean_delta - z * se, mean_delta + z * se
        if se_floor > 0:  # a difference of two rates lies in [-1, 1]
            low, high = max(low, -1.0), min(high, 1.0)
        interval = Interval(low, high, confidence)
    return MetricDelta(
        metric=metric,
        before=math.fsum(befores) / len(befores),
        after=math.fsum(afters) / len(afters),
        delta=mean_delta,
        interval=interval,
    )


def _paired_se(differences: Sequence[float]) -> float:
    m = len(differences)
    if m < 2:
        return 0.0
    mean = math.fsum(differences) / m
    return math.sqrt(math.fsum((d - mean) ** 2 for d in differences) / (m - 1) / m)


def _trial_level_se(pairs: Sequence[tuple[CaseSummary, CaseSummary]]) -> float:
    def variance(case: CaseSummary) -> float:
        q = (case.c + 1) / (case.n + 2)
        return q * (1 - q) / case.n

    total = math.fsum(variance(b) + variance(a) for b, a in pairs)
    return math.sqrt(total) / len(pairs)


def _power_z(power: float) -> float:
    if not 0 < power < 1:
        raise ValueError(f"power={power}: must be between 0 and 1")
    return NormalDist().inv_cdf(power)


def _points(rate: float) -> str:
    points = rate * 100
    return f"{points:.0f}" if round(points) >= 1 else f"{points:.1f}"


def _round_up_2_significant(value: int) -> int:
    if value < 100:
        return value
    step = 10 ** (len(str(value)) - 2)
    return int(-(-value // step) * step)
