"""The CI gate: threshold expressions on a suite's figures, and regression checks.

A gate is clauses joined by `and`, each `METRIC OPERATOR NUMBER`, for example
`pass^k>=0.8` or `pass@1>=0.9 and cost<=0.05`. Metrics are the suite figures:
pass@1, pass@k and pass^k (rates in [0, 1]), cost (mean per trial, in the budget's
currency), latency_ms, tokens and steps (means per trial). `or` and parentheses are
refused on purpose: a CI gate reads as a list of conditions that must all hold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from runs.engine.eval_comparison import (
    DEFAULT_FLIP_THRESHOLD,
    MetricDelta,
    SuiteComparison,
    compare_suites,
)
from runs.engine.eval_metrics import DEFAULT_CONFIDENCE, SuiteSummary

METRICS = ("pass@1", "pass@k", "pass^k", "cost", "latency_ms", "tokens", "steps")
RATE_METRICS = frozenset({"pass@1", "pass@k", "pass^k"})
OPERATORS = (">=", ">", "<=", "<", "==")
ALLOWED = (
    f"allowed: metrics {', '.join(METRICS)}; operators {', '.join(OPERATORS)}; "
    "clauses joined by 'and'; e.g. \"pass^k>=0.8 and cost<=0.05\""
)
# Rates are means of c/n fractions; a float rounding must not fail `pass@1>=0.9`.
_RATE_TOLERANCE = Decimal("1e-9")

_TOKEN = re.compile(
    r"(?P<space>\s+)"
    r"|(?P<metric>pass@1|pass@k|pass\^k|cost|latency_ms|tokens|steps)(?![\w@^])"
    r"|(?P<operator>>=|<=|==|>|<)(?![<>=!])"
    r"|(?P<number>(?:\d+(?:\.\d*)?|\.\d+))(?![\w.])"
    r"|(?P<and>and)(?!\w)",
    re.IGNORECASE,
)
_ARTICLE = {"metric": "a metric", "operator": "an operator", "number": "a number"}
_BAD_TOKEN = re.compile(r"[<>=!]+|[^\s<>=!]+")


@dataclass(frozen=True)
class GateClause:
    metric: str
    operator: str
    threshold: Decimal

    def __str__(self) -> str:
        return f"{self.metric}{self.operator}{self.threshold}"


@dataclass(frozen=True)
class Gate:
    source: str
    clauses: tuple[GateClause, ...]


@dataclass(frozen=True)
class ClauseResult:
    clause: GateClause
    actual: Decimal
    passed: bool

    def describe(self) -> str:
        verdict = "ok" if self.passed else "FAILED"
        return (
            f"{self.clause}: {self.clause.metric} is {_show(self.actual)} ({verdict})"
        )


@dataclass(frozen=True)
class GateResult:
    passed: bool
    clauses: tuple[ClauseResult, ...]

    @property
    def failures(self) -> tuple[ClauseResult, ...]:
        return tuple(c for c in self.clauses if not c.passed)


def parse_gate(expression: str) -> Gate:
    """Parse a gate expression; a ValueError names the bad token and what is allowed."""
    tokens = _tokenise(expression)
    if not tokens:
        raise ValueError(f"the gate expression is empty; {ALLOWED}")
    clauses = []
    expected = ("metric", "operator", "number")
    position = 0
    while True:
        parts: list[str] = []
        for kind in expected:
            if position >= len(tokens):
                after = f" after {parts[-1]!r}" if parts else ""
                raise ValueError(
                    f"gate {expression!r}: expected {_ARTICLE[kind]}{after} but the "
                    f"expression ended; {ALLOWED}"
                )
            token_kind, text, offset = tokens[position]
            if token_kind != kind:
                raise ValueError(
                    f"gate {expression!r}: expected {_ARTICLE[kind]} at position "
                    f"{offset} but found {text!r}; {ALLOWED}"
                )
            parts.append(text)
            position += 1
        metric, operator, number = parts[0].lower(), parts[1], Decimal(parts[2])
        if metric in RATE_METRICS and number > 1:
            raise ValueError(
                f"gate {expression!r}: {metric} is a rate between 0 and 1, "
                f"not {parts[2]!r} (write 0.8 for 80%); {ALLOWED}"
            )
        clauses.append(GateClause(metric, operator, number))
        if position == len(tokens):
            return Gate(expression, tuple(clauses))
        token_kind, text, offset = tokens[position]
        if token_kind != "and":
            raise ValueError(
                f"gate {expression!r}: expected 'and' at position {offset} "
                f"but found {text!r}; {ALLOWED}"
            )
        position += 1


def _tokenise(expression: str) -> list[tuple[str, str, int]]:
    tokens = []
    position = 0
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if match is None:
            bad = _BAD_TOKEN.match(expression, position)
            text = bad.group(0) if bad else expression[position]
            raise ValueError(
                f"gate {expression!r}: unknown token {text!r} at position "
                f"{position}; {ALLOWED}"
            )
        kind = match.lastgroup or ""
        if kind != "space":
            tokens.append((kind, match.group(0), position))
        position = match.end()
    return tokens


def metric_value(summary: SuiteSummary, metric: str) -> Decimal:
    """A suite figure by its gate name, as a Decimal."""
    values: dict[str, Decimal | float] = {
        "pass@1": summary.pass_at_1,
        "pass@k": summary.pass_at_k,
        "pass^k": summary.pass_hat_k,
        "cost": summary.mean_cost,
        "latency_ms": summary.mean_latency_ms,
        "tokens": summary.mean_tokens,
        "steps": summary.mean_steps,
    }
    if metric not in values:
        raise ValueError(f"unknown metric {metric!r}; {ALLOWED}")
    value = values[metric]
    return value if isinstance(value, Decimal) else Decimal(repr(value))


def evaluate_gate(gate: Gate | str, summary: SuiteSummary) -> GateResult:
    """Check every clause of a gate against a suite summary."""
    gate = parse_gate(gate) if isinstance(gate, str) else gate
    results = []
    for clause in gate.clauses:
        actual = metric_value(summary, clause.metric)
        tolerance = _RATE_TOLERANCE if clause.metric in RATE_METRICS else Decimal(0)
        results.append(ClauseResult(clause, actual, _holds(clause, actual, tolerance)))
    return GateResult(all(r.passed for r in results), tuple(results))


def _holds(clause: GateClause, actual: Decimal, tolerance: Decimal) -> bool:
    threshold = clause.threshold
    if clause.operator == ">=":
        return actual >= threshold - tolerance
    if clause.operator == ">":
        return actual > threshold + tolerance
    if clause.operator == "<=":
        return actual <= threshold + tolerance
    if clause.operator == "<":
        return actual < threshold - tolerance
    return abs(actual - threshold) <= tolerance


@dataclass(frozen=True)
class RegressionResult:
    passed: bool
    reasons: tuple[str, ...]
    comparison: SuiteComparison


def regression_check(
    *,
    baseline: SuiteSummary,
    current: SuiteSummary,
    confidence: float = DEFAULT_CONFIDENCE,
    flip_threshold: float = DEFAULT_FLIP_THRESHOLD,
) -> RegressionResult:
    """Fail when pass@1 or pass^k fell beyond the noise, or a case regressed.

    "Beyond the noise" means the whole paired interval of the delta is below zero.
    Raises ValueError when the two runs share no case.
    """
    comparison = compare_suites(
        baseline, current, confidence=confidence, flip_threshold=flip_threshold
    )
    reasons = [
        _drop_reason(delta)
        for delta in (comparison.pass_at_1, comparison.pass_hat_k)
        if delta.interval is not None and delta.interval.high < 0
    ]
    reasons.extend(
        f"case {flip.case_id} went from passing to failing "
        f"(pass@1 {flip.before:.2f} -> {flip.after:.2f})"
        for flip in comparison.regressions
    )
    return RegressionResult(not reasons, tuple(reasons), comparison)


def _drop_reason(delta: MetricDelta) -> str:
    assert delta.interval is not None
    interval = delta.interval
    return (
        f"{delta.metric} fell from {delta.before:.2f} to {delta.after:.2f} "
        f"({delta.delta:+.2f}; {interval.confidence:.0%} interval "
        f"{interval.low:+.2f} to {interval.high:+.2f})"
    )


def _show(value: Decimal) -> str:
    return f"{value.normalize():f}" if value == value.to_integral() else f"{value:.4g}"
