"""Terminal text for an eval run: a progress line, one line per case, a summary."""

from __future__ import annotations

from runs.engine.eval_metrics import CaseSummary, SuiteSummary

PROGRESS_WIDTH = 20


def progress_line(
    done: int, total: int, passed: int, width: int = PROGRESS_WIDTH
) -> str:
    """`trials 12/100 [##..................] 12%  passed 9`, for a redrawn line."""
    if total < 1:
        raise ValueError(f"total={total}: an eval run has at least one trial")
    if not 0 <= done <= total:
        raise ValueError(f"done={done}: must be between 0 and total={total}")
    if not 0 <= passed <= done:
        raise ValueError(f"passed={passed}: must be between 0 and done={done}")
    if width < 1:
        raise ValueError(f"width={width}: the bar needs at least one cell")
    filled = done * width // total
    bar = "#" * filled + "." * (width - filled)
    return f"trials {done}/{total} [{bar}] {done * 100 // total}%  passed {passed}"


def case_status(case: CaseSummary) -> str:
    """PASS when every trial passed, FAIL when none did, FLAKY in between."""
    if case.c == case.n:
        return "PASS"
    return "FAIL" if case.c == 0 else "FLAKY"


def case_report_line(case: CaseSummary) -> str:
    """One line per case: status, trials passed, rates, means, first failure reason."""
    line = (
        f"{case_status(case):<5} {case.case_id}  {case.c}/{case.n} passed  "
        f"pass@1 {case.pass_at_1:.2f}  pass^k {case.pass_hat_k:.2f}  "
        f"cost {case.mean_cost:.4f}  {case.mean_latency_ms / 1000:.1f} s"
    )
    reasons = [r for t in case.failed_trials for r in t.reasons]
    if reasons:
        line += f"  - {reasons[0]}"
    return line.replace("\n", " ")


def suite_report_lines(summary: SuiteSummary) -> list[str]:
    """The case lines followed by the suite's figures."""
    interval = summary.pass_at_1_interval
    return [case_report_line(case) for case in summary.cases] + [
        f"{len(summary.cases)} cases, {summary.trials} trials, k={summary.k}: "
        f"pass@1 {summary.pass_at_1:.2f} ({interval.confidence:.0%} interval "
        f"{interval.low:.2f}-{interval.high:.2f})  pass@k {summary.pass_at_k:.2f}  "
        f"pass^k {summary.pass_hat_k:.2f}  cost {summary.mean_cost:.4f}/trial  "
        f"tokens {summary.mean_tokens:.0f}  steps {summary.mean_steps:.1f}  "
        f"latency {summary.mean_latency_ms / 1000:.1f} s"
    ]
