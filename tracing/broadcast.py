"""Send events to the channel layer from sync code over one long-lived loop.

`async_to_sync(layer.group_send)` from a plain thread builds an event loop (and
channels-redis a connection pool) per call. One background thread per process
owns a loop and its pooled connections; a writer hands its message over and
waits for the send (bounded), so messages leave in commit order with the
latency of one Redis round trip. A send that fails or times out is logged: the
log is the record and streams refill gaps from it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from typing import Any

from channels.layers import get_channel_layer

__all__ = ["broadcaster"]

logger = logging.getLogger(__name__)

SEND_TIMEOUT_SECONDS = 2.0


class Broadcaster:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="run-event-broadcast", daemon=True
        )
        self.thread.start()

    async def _send(self, groups: list[str], message: dict[str, Any]) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        for group in groups:
            await layer.group_send(group, message)

    def send(self, groups: list[str], message: dict[str, Any]) -> None:
        future = asyncio.run_coroutine_threadsafe(
            self._send(groups, message), self.loop
        )
        try:
            future.result(SEND_TIMEOUT_SECONDS)
        except concurrent.futures.TimeoutError:
            logger.warning(
                "broadcast to %s timed out; streams refill from the log", groups
            )
        except Exception:  # noqa: BLE001 - the layer is best effort
            logger.warning("broadcast to %s failed", groups, exc_info=True)


_lock = threading.Lock()
_broadcaster: Broadcaster | None = None


def broadcaster() -> Broadcaster:
    """This process's broadcaster (a forked child starts its own)."""
    global _broadcaster
    with _lock:
        if _broadcaster is None or _broadcaster.pid != os.getpid():
            _broadcaster = Broadcaster()
        return _broadcaster
