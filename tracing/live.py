"""Live text of a span while it runs (a model's streamed reply), for display only.

Deltas are ephemeral: they go to the run's channel group, never to the event log,
and a client that misses some loses nothing that counts (spec §1.4: the span
stored when it ends holds the whole output; that is the record). They are
throttled: text is gathered and sent at most every `interval` seconds (what
waits is sent after at most `interval`), plus the tail when the call ends. Each
message says where its text starts (`offset`), so a client sees a gap or a
repeat; a `reset` says the text so far is void (a dropped stream asked again, a
fallback answering).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from controlplane.redaction import redact
from tracing.broadcast import broadcaster
from tracing.services import run_group

__all__ = ["SpanDeltaRelay", "span_delta_message"]

logger = logging.getLogger(__name__)

DELTA_INTERVAL_SECONDS = 0.1


def span_delta_message(
    *, run_id: object, span_id: str, offset: int, text: str, reset: bool = False
) -> dict[str, Any]:
    """The channel-layer message of one batch of live text."""
    return {
        "type": "run.delta",
        "delta": {
            "run_id": str(run_id),
            "span_id": span_id,
            "offset": offset,
            "text": text,
            "reset": reset,
        },
    }


class SpanDeltaRelay:
    """A `DeltaSink` (runs.engine.adapters) that relays a span's text to its run's
    stream, throttled. Never raises: live text is best effort."""

    def __init__(
        self,
        *,
        run_id: object,
        span_id: str,
        interval: float = DELTA_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_id = run_id
        self.span_id = span_id
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._sent = 0  # characters sent so far
        self._last = 0.0
        self._timer: threading.Timer | None = None
        self.messages = 0

    def __call__(self, text: str) -> None:
        with self._lock:
            self._pending.append(text)
            if self._clock() - self._last >= self.interval:
                self._flush()
            elif self._timer is None:
                # The tail goes out even if the model pauses (writing a tool
                # call's arguments, which are not shown live).
                self._timer = threading.Timer(self.interval, self._flush_later)
                self._timer.daemon = True
                self._timer.start()

    def _flush_later(self) -> None:
        with self._lock:
            self._timer = None
            self._flush()

    def discard(self, reason: str) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._pending = []
            if self._sent:
                self._send(offset=0, text="", reset=True)
            self._sent = 0

    def close(self) -> None:
        """Send what is still gathered (the call ended)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._flush()

    def _flush(self) -> None:
        self._last = self._clock()
        if not self._pending:
            return
        text, self._pending = "".join(self._pending), []
        self._send(offset=self._sent, text=text, reset=False)
        self._sent += len(text)

    def _send(self, *, offset: int, text: str, reset: bool) -> None:
        try:
            message = span_delta_message(
                run_id=self.run_id, span_id=self.span_id, offset=offset,
                text=redact(text), reset=reset,
            )  # fmt: skip
            broadcaster().send([run_group(self.run_id)], message)
            self.messages += 1
        except Exception:  # noqa: BLE001 - display only, never breaks the call
            logger.warning("live text of span %s not sent", self.span_id, exc_info=True)
