"""Send events to the channel layer from sync code without waiting on Redis.

`async_to_sync(layer.group_send)` from a plain thread builds an event loop (and
channels-redis a connection pool) per call, a cost paid inside every span. One
background thread per process owns a loop and sends queued messages in order;
writers only enqueue. A message still queued when the process dies is lost to
the layer, never to a client: the log is the record and streams refill gaps.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
from typing import Any

from channels.layers import get_channel_layer

__all__ = ["broadcaster"]

logger = logging.getLogger(__name__)


class Broadcaster:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.pending = 0
        self.idle = threading.Condition()
        self.thread = threading.Thread(
            target=self._run, name="run-event-broadcast", daemon=True
        )
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.queue: asyncio.Queue[tuple[list[str], dict[str, Any]]] = asyncio.Queue()
        self.loop.create_task(self._drain())
        self.ready.set()
        self.loop.run_forever()

    async def _drain(self) -> None:
        layer = get_channel_layer()
        while True:
            groups, message = await self.queue.get()
            try:
                if layer is not None:
                    for group in groups:
                        await layer.group_send(group, message)
            except Exception:  # noqa: BLE001 - the layer is best effort
                logger.warning("broadcast to %s failed", groups, exc_info=True)
            finally:
                with self.idle:
                    self.pending -= 1
                    self.idle.notify_all()

    def send(self, groups: list[str], message: dict[str, Any]) -> None:
        with self.idle:
            self.pending += 1
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (groups, message))

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far was handed to the layer."""
        with self.idle:
            return self.idle.wait_for(lambda: self.pending == 0, timeout)


_lock = threading.Lock()
_broadcaster: Broadcaster | None = None


def broadcaster() -> Broadcaster:
    """This process's broadcaster (a forked child starts its own)."""
    global _broadcaster
    with _lock:
        if _broadcaster is None or _broadcaster.pid != os.getpid():
            _broadcaster = Broadcaster()
            # A short-lived process (a CLI, a script) hands over what it queued.
            atexit.register(_broadcaster.flush, 2.0)
        return _broadcaster
