"""Failpoints: named places where a crash test kills the worker for real.

Inert unless RUN_FAILPOINTS names the point; then the first process to reach it
(marked by a file in RUN_FAILPOINT_DIR) is killed with SIGKILL, exactly as a
worker lost to the OOM killer or a power cut would be. Used by the crash tests.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


def failpoint(name: str) -> None:
    armed = os.environ.get("RUN_FAILPOINTS", "")
    if not armed or name not in armed.split(","):
        return
    marker = Path(os.environ.get("RUN_FAILPOINT_DIR", "/tmp")) / f"failpoint-{name}"
    try:
        marker.touch(exist_ok=False)  # only the first arrival dies
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)
