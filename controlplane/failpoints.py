"""Failpoints: named places where a crash test kills the worker for real.

Inert unless RUN_FAILPOINTS names the point; then the first process to reach it
(marked by a file in RUN_FAILPOINT_DIR) is killed with SIGKILL, exactly as a
worker lost to the OOM killer or a power cut would be. Used by the crash tests.
With RUN_FAILPOINT_ACTION=pause it waits instead, until the test creates the
marker's `.resume` file (at most PAUSE_SECONDS): the test breaks something
outside the process (the database's connections) while the step is held there.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

PAUSE_SECONDS = 120.0


def failpoint(name: str) -> None:
    armed = os.environ.get("RUN_FAILPOINTS", "")
    if not armed or name not in armed.split(","):
        return
    marker = Path(os.environ.get("RUN_FAILPOINT_DIR", "/tmp")) / f"failpoint-{name}"
    try:
        marker.touch(exist_ok=False)  # only the first arrival dies
    except FileExistsError:
        return
    if os.environ.get("RUN_FAILPOINT_ACTION") == "pause":
        resume = marker.with_name(marker.name + ".resume")
        deadline = time.monotonic() + PAUSE_SECONDS
        while not resume.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return
    os.kill(os.getpid(), signal.SIGKILL)
