"""Removal of a finished run's cgroups, /tmp mount and run directory, off the
caller's path.

By the time a result is returned every process of the run is gone (`reap_confirmed`:
the cgroup reported `populated 0`) and its counters and /tmp usage have been read;
what is left is empty directories and a mount. Removing them costs ~1.5 ms on this
host (a lazy umount alone up to 2.7 ms), so one background thread per process does
it after the result is handed back. Nothing a later run depends on waits for it:
every run has its own names.

`wait_for_teardown()` blocks until everything handed over so far is removed (tests,
the benchmark and the CLI call it before they look for leftovers or exit). If the
process dies first, the janitor removes what is left: the names carry the owner.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

_cond = threading.Condition()
_queue: collections.deque[Callable[[], None]] = collections.deque()
_busy = 0  # handed over and not finished yet (queued or running)
_worker: threading.Thread | None = None


def defer(step: Callable[[], None]) -> None:
    """Run `step` on the teardown thread; its exceptions are logged, not raised."""
    global _busy, _worker
    with _cond:
        _queue.append(step)
        _busy += 1
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(
                target=_work, name="sandbox-teardown", daemon=True
            )
            _worker.start()
        _cond.notify_all()


def wait_for_teardown(timeout: float | None = None) -> bool:
    """Block until every deferred teardown has finished; False on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _cond:
        while _busy:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            _cond.wait(remaining)
    return True


def _work() -> None:
    global _busy
    while True:
        with _cond:
            while not _queue:
                _cond.wait()
            step = _queue.popleft()
        try:
            step()
        except Exception:
            log.exception("sandbox teardown failed; the janitor will retry")
        finally:
            with _cond:
                _busy -= 1
                _cond.notify_all()


def _after_fork_in_child() -> None:
    # The thread does not exist in a forked child; what the parent queued is the
    # parent's to finish.
    global _cond, _queue, _busy, _worker
    _cond = threading.Condition()
    _queue = collections.deque()
    _busy = 0
    _worker = None


os.register_at_fork(after_in_child=_after_fork_in_child)
# A daemon thread dies with the interpreter: finish first (bounded).
atexit.register(wait_for_teardown, 10.0)
