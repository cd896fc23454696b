"""The live-text relay over the real channel layer: throttled batches with
offsets, a tail sent after a pause, a reset, and nothing in the event log."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from channels.layers import get_channel_layer

from tracing.live import SpanDeltaRelay
from tracing.services import run_group


async def received(layer: Any, channel: str, wait: float = 2.0) -> list[dict[str, Any]]:
    got = []
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            message = await asyncio.wait_for(layer.receive(channel), 0.3)
        except TimeoutError:
            if got:
                return got
            continue
        got.append(message["delta"])
    return got


async def test_batches_are_throttled_and_the_tail_follows_a_pause() -> None:
    layer = get_channel_layer()
    run_id = uuid.uuid4()
    channel = await layer.new_channel()
    await layer.group_add(run_group(run_id), channel)
    try:
        relay = SpanDeltaRelay(run_id=run_id, span_id="ab" * 8, interval=0.2)
        started = time.monotonic()
        for piece in ["Hel", "lo", ", wor", "ld"]:
            relay(piece)  # the first goes at once, the rest wait for the interval
        first = await received(layer, channel)
        assert [d["text"] for d in first] == ["Hel", "lo, world"]
        assert [d["offset"] for d in first] == [0, 3]
        assert time.monotonic() - started < 1.5  # the tail came without a close
        relay.discard("stream_interrupted")
        relay("Again")
        relay.close()
        second = await received(layer, channel)
        assert [(d["reset"], d["offset"], d["text"]) for d in second] == [
            (True, 0, ""),
            (False, 0, "Again"),
        ]
        assert all(d["span_id"] == "ab" * 8 for d in first + second)
        assert relay.messages == 4
    finally:
        await layer.group_discard(run_group(run_id), channel)
