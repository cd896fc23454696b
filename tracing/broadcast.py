"""Send events to the channel layer from sync code over one long-lived loop.

`async_to_sync(layer.group_send)` from a plain thread builds an event loop (and
channels-redis a connection pool) per call. One background thread per process
owns a loop, its pooled connections and a queue: a writer hands its message
over and goes on (a step must not wait for Redis round trips), and one consumer
sends the messages one after another, so they leave in commit order. Run events
queued meanwhile for the same group leave as one `run.events` message (a
group_send costs several Redis commands, and a step commits a few events at
once). A send
that fails or times out, or a message that finds the queue full, is logged: the
log is the record and streams refill gaps from it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from channels.layers import get_channel_layer

__all__ = ["broadcaster"]

logger = logging.getLogger(__name__)

SEND_TIMEOUT_SECONDS = 2.0
QUEUE_LIMIT = 10_000
BATCH_LIMIT = 200
Message = tuple[list[str], dict[str, Any]]


class Broadcaster:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.queue: asyncio.Queue[Message] = asyncio.Queue(QUEUE_LIMIT)
        self._held = threading.local()  # .items: messages of an open `together()`
        self.thread = threading.Thread(
            target=self._run, name="run-event-broadcast", daemon=True
        )
        self.thread.start()

    def _run(self) -> None:
        self.loop.create_task(self._consume())
        self.loop.run_forever()

    async def _consume(self) -> None:
        while True:
            items = [await self.queue.get()]
            while not self.queue.empty() and len(items) < BATCH_LIMIT:
                items.append(self.queue.get_nowait())
            try:
                for group, message in _by_group(items):
                    try:
                        await asyncio.wait_for(
                            self._send(group, message), SEND_TIMEOUT_SECONDS
                        )
                    except TimeoutError:
                        logger.warning(
                            "broadcast to %s timed out; streams refill from the log",
                            group,
                        )
                    except Exception:  # noqa: BLE001 - the layer is best effort
                        logger.warning("broadcast to %s failed", group, exc_info=True)
            finally:
                for _ in items:
                    self.queue.task_done()

    async def _send(self, group: str, message: dict[str, Any]) -> None:
        layer = get_channel_layer()
        if layer is not None and await _has_members(layer, group):
            await layer.group_send(group, message)

    def _put_all(self, items: list[Message]) -> None:
        for item in items:
            try:
                self.queue.put_nowait(item)
            except asyncio.QueueFull:
                logger.warning("broadcast queue full; streams refill from the log")
                return

    def send(self, groups: list[str], message: dict[str, Any]) -> None:
        """Queue the message for sending; returns at once."""
        held: list[Message] | None = getattr(self._held, "items", None)
        if held is not None:
            held.append((groups, message))
        else:
            self.loop.call_soon_threadsafe(self._put_all, [(groups, message)])

    @contextmanager
    def together(self) -> Iterator[None]:
        """Messages sent inside are queued at once when it ends, so the consumer
        sees them together (and merges what goes to the same group)."""
        if getattr(self._held, "items", None) is not None:  # the outer one queues
            yield
            return
        self._held.items = []
        try:
            yield
        finally:
            items, self._held.items = self._held.items, None
            if items:
                self.loop.call_soon_threadsafe(self._put_all, items)

    def flush(self, timeout: float = SEND_TIMEOUT_SECONDS) -> bool:
        """Wait until every queued message was sent (or given up); False on timeout."""

        async def drained() -> None:
            await self.queue.join()

        future = asyncio.run_coroutine_threadsafe(drained(), self.loop)
        try:
            future.result(timeout)
        except concurrent.futures.TimeoutError:
            return False
        return True


async def _has_members(layer: Any, group: str) -> bool:
    """Whether anyone listens to the group, in one round trip (channels-redis's
    group_send spends two to find out, and most runs are not watched live)."""
    if not hasattr(layer, "_group_key"):  # not channels-redis: let it decide
        return True
    key = layer._group_key(group)
    connection = layer.connection(layer.consistent_hash(group))
    async with connection.pipeline(transaction=False) as pipe:
        pipe.zremrangebyscore(key, min=0, max=int(time.time()) - layer.group_expiry)
        pipe.zcard(key)
        _, members = await pipe.execute()
    return bool(members)


def _by_group(items: list[Message]) -> list[tuple[str, dict[str, Any]]]:
    """One message per group, in order; its run events merged into `run.events`."""
    merged: dict[str, list[dict[str, Any]]] = {}
    for groups, message in items:
        for group in groups:
            merged.setdefault(group, []).append(message)
    out = []
    for group, messages in merged.items():
        if len(messages) > 1 and all(m.get("type") == "run.event" for m in messages):
            events = [m["event"] for m in messages]
            out.append((group, {"type": "run.events", "events": events}))
        else:
            out.extend((group, message) for message in messages)
    return out


_lock = threading.Lock()
_broadcaster: Broadcaster | None = None


def broadcaster() -> Broadcaster:
    """This process's broadcaster (a forked child starts its own)."""
    global _broadcaster
    with _lock:
        if _broadcaster is None or _broadcaster.pid != os.getpid():
            _broadcaster = Broadcaster()
        return _broadcaster


@atexit.register
def _flush_at_exit() -> None:
    # A command that ends right after its last event (run_agent) still sends it.
    if _broadcaster is not None and _broadcaster.pid == os.getpid():
        _broadcaster.flush()
