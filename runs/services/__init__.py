"""Writes for runs: start, advance one step, cancel, resume after a decision."""

from runs.services.advance import DatabaseLost, run_advance
from runs.services.lifecycle import (
    RunConflict,
    RunInputError,
    run_cancel,
    run_resume,
    run_start,
)
from runs.services.recovery import recover_stalled_runs

__all__ = [
    "DatabaseLost",
    "RunConflict",
    "RunInputError",
    "recover_stalled_runs",
    "run_advance",
    "run_cancel",
    "run_resume",
    "run_start",
]
