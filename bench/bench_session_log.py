"""Session log benchmark (issue 28): a 500-turn scripted run whose transcript
would be ten times the model's window, stepped by the real step code
(`run_advance`, in this process) on a real database.

Printed, next to the same run's own baseline:
  * the largest model input as a share of the window (every call must fit), and
    how many compactions it took;
  * the per-call cost of keeping the context the log rebuilds (the host's
    incremental rebuild: logging what the transcript gained), p50/p99, next to
    the step's whole time between model calls;
  * a full `build_context` from the leaf over 10,000 entries (the run's log
    continued in memory by the same functions), and the stored log's bytes per
    entry at every 500 entries (linear growth: flat bytes/entry).

`--postgres URL` (or BENCH_POSTGRES_URL) runs on PostgreSQL; SQLite otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from decimal import Decimal
from typing import Any

from bench.agents import scripted_agent
from bench.django_env import django_setup, percentile

TURNS = 500
WINDOW_TOKENS = 12_000  # the run's messages sum to about ten times this
THRESHOLD = 0.7
TEXT = "order 4821, replacement kettle, spout dented; " * 8  # ~380 characters
REBUILD_ENTRIES = 10_000
REBUILD_ROUNDS = 20


def script(turns: int) -> list[dict[str, Any]]:
    calls = [
        {"tool_calls": [{"id": f"c{i}", "name": "echo",
                         "arguments": {"text": f"turn {i}: {TEXT}"}}],
         "usage": {"input_tokens": 100, "output_tokens": 10}}
        for i in range(turns - 1)
    ]  # fmt: skip
    return [
        *calls,
        {"text": "done", "usage": {"input_tokens": 100, "output_tokens": 5}},
    ]


def timed_hooks() -> tuple[list[tuple[float, int]], list[float]]:
    """Record each model call (time, input tokens) and each incremental log
    update's duration, in this process, around the real functions."""
    from runs.engine.adapters.scripted import ScriptedModel
    from runs.engine.budget import estimate_input_tokens
    from runs.engine.session import SUMMARY_INSTRUCTIONS, SessionCursor

    calls: list[tuple[float, int]] = []
    log_ms: list[float] = []
    complete = ScriptedModel.complete
    log_transcript = SessionCursor.log_transcript

    def timed_complete(self: Any, messages: Any, tools: Any, *a: Any, **k: Any) -> Any:
        if messages and messages[0].get("content") != SUMMARY_INSTRUCTIONS:
            tokens = estimate_input_tokens(json.dumps(list(messages)), tools)
            calls.append((time.perf_counter(), tokens))
        return complete(self, messages, tools, *a, **k)

    def timed_log(self: Any, transcript: Any) -> None:
        started = time.perf_counter()
        log_transcript(self, transcript)
        log_ms.append((time.perf_counter() - started) * 1000)

    ScriptedModel.complete = timed_complete  # type: ignore[method-assign]
    SessionCursor.log_transcript = timed_log  # type: ignore[method-assign]
    return calls, log_ms


def drive(run: Any) -> Any:
    from runs.models import Run
    from runs.services import run_advance

    while True:
        run.refresh_from_db()
        if run.status not in (Run.Status.QUEUED, Run.Status.RUNNING):
            return run
        run_advance(run_id=str(run.id), step_token=str(run.step_token), owner="bench")


def stored_bytes(run_id: Any) -> list[tuple[int, float]]:
    """Bytes per entry of the stored log (payload JSON plus the row's other
    columns) at five points of its growth."""
    from runs.models import SessionEntry

    rows = SessionEntry.objects.filter(run_id=run_id).order_by("seq")
    every = max(1, rows.count() // 5)
    total = 0
    points = []
    for count, (entry_id, parent_id, type_, payload) in enumerate(
        rows.values_list("entry_id", "parent_id", "type", "payload").iterator(), 1
    ):
        # seq and run (8 + 16 bytes), created_at (8), the id (8), the strings.
        total += 40 + len(entry_id) + len(parent_id) + len(type_)
        total += len(json.dumps(payload, ensure_ascii=False).encode())
        if count % every == 0:
            points.append((count, total / count))
    return points


def rebuild_at(entries_wanted: int, run: Any) -> tuple[float, float, int]:
    """Continue the run's log in memory to `entries_wanted` entries, with the
    host's own functions (turns, dropped outputs, compactions); time a full
    rebuild from the leaf (p50 ms), and the read of the stored log (ms)."""
    from runs.engine.actions import ToolCall
    from runs.engine.loop import EngineState
    from runs.engine.session import (
        SessionEntry,
        apply_compaction,
        build_context,
        drop_old_tool_outputs,
        estimate_tokens,
        first_kept_index,
        session_path,
    )
    from runs.models import SessionEntry as Row

    started = time.perf_counter()
    rows = list(
        Row.objects.filter(run_id=run.id)
        .order_by("seq")
        .values_list("seq", "entry_id", "parent_id", "type", "payload")
    )
    read_ms = (time.perf_counter() - started) * 1000
    log = {
        e: SessionEntry(seq, e, p or None, t, payload) for seq, e, p, t, payload in rows
    }
    state = EngineState.from_dict(run.engine_state)
    transcript, cursor = state.transcript, state.session
    turn = TURNS
    while cursor.next_seq < entries_wanted:
        call = ToolCall.parse(f"x{turn}", "echo", json.dumps({"text": TEXT}))
        transcript.append_assistant(f"turn {turn}", [call])
        transcript.append_tool_message(
            {"role": "tool", "tool_call_id": call.call_id, "content": TEXT}
        )
        cursor.log_transcript(transcript)
        if estimate_tokens(transcript.messages) > WINDOW_TOKENS * THRESHOLD:
            drop_old_tool_outputs(transcript, cursor)
            if estimate_tokens(transcript.messages) > WINDOW_TOKENS * THRESHOLD:
                keep = first_kept_index(transcript.messages)
                assert keep is not None
                apply_compaction(
                    transcript, cursor, summary=f"up to turn {turn}",
                    keep_from=keep, tokens_before=WINDOW_TOKENS,
                )  # fmt: skip
        for entry in cursor.take_unwritten():
            log[entry.entry_id] = entry
        turn += 1
    times = []
    for _ in range(REBUILD_ROUNDS):
        started = time.perf_counter()
        rebuilt = build_context(log, cursor.leaf)
        times.append((time.perf_counter() - started) * 1000)
    assert rebuilt == transcript.messages, "the log does not rebuild the context"
    # The whole path to the root, which a rebuild that did not stop at the
    # latest compaction's first kept entry would walk.
    walk = []
    for _ in range(REBUILD_ROUNDS):
        started = time.perf_counter()
        session_path(log, cursor.leaf)
        walk.append((time.perf_counter() - started) * 1000)
    print(
        f"  (context at the leaf: {len(rebuilt)} messages; walking the whole "
        f"path to the root: {statistics.median(walk):.2f} ms)"
    )
    # Baseline: decoding the checkpoint's messages, which a step does anyway.
    encoded = json.dumps(transcript.messages)
    decode = []
    for _ in range(REBUILD_ROUNDS):
        started = time.perf_counter()
        json.loads(encoded)
        decode.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), statistics.median(decode), read_ms, len(log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--postgres", default=os.environ.get("BENCH_POSTGRES_URL"))
    parser.add_argument("--turns", type=int, default=TURNS)
    options = parser.parse_args()
    os.environ.setdefault("RUN_MAX_STEPS", str(options.turns * 2))
    os.environ.setdefault("RUN_MAX_TOOL_CALLS", str(options.turns * 2))
    os.environ.setdefault("RUN_MAX_WALL_SECONDS", "36000")
    url = django_setup(options.postgres or None)
    from budgets.models import ModelPriceEntry
    from controlplane.services import tenant_create
    from runs.engine.session import SessionEntry as Entry
    from runs.engine.session import build_context
    from runs.models import SessionEntry
    from runs.services import run_start

    ModelPriceEntry.objects.update_or_create(
        tenant=None, model="scripted",
        defaults={"input_per_million": Decimal(0), "output_per_million": Decimal(0),
                  "cached_input_per_million": Decimal(0),
                  "context_window_tokens": WINDOW_TOKENS},
    )  # fmt: skip
    tenant = tenant_create(slug=f"bench-log-{os.getpid()}", name="Bench")
    agent = scripted_agent(tenant, "long", tools=["echo"], script=script(options.turns))
    version = agent.current_version
    version.compaction_threshold = THRESHOLD
    version.save(update_fields=["compaction_threshold"])
    calls, log_ms = timed_hooks()
    run = run_start(tenant=tenant, agent_slug="long", input="go", started_by=None)
    started = time.perf_counter()
    run = drive(run)
    seconds = time.perf_counter() - started
    assert run.stop_reason == "done", (run.stop_reason, run.stop_detail)
    rows = SessionEntry.objects.filter(run=run).order_by("seq")
    log = [
        Entry(r.seq, r.entry_id, r.parent_id or None, r.type, r.payload) for r in rows
    ]
    assert (
        build_context(log, run.engine_state["session"]["leaf"])
        == (run.engine_state["messages"])
    )
    raw_tokens = sum(
        len(json.dumps(e.payload["message"])) // 4 for e in log if e.type == "message"
    )
    largest = max(tokens for _, tokens in calls)
    gaps = [(b - a) * 1000 for (a, _), (b, _) in zip(calls, calls[1:], strict=False)]
    kinds: dict[str, int] = {}
    for entry in log:
        kinds[entry.type] = kinds.get(entry.type, 0) + 1
    print(f"database: {url.split('://')[0]}; {options.turns} turns in {seconds:.1f} s")
    print(
        f"transcript without compaction: {raw_tokens:,} tokens = "
        f"{raw_tokens / WINDOW_TOKENS:.1f}x the {WINDOW_TOKENS:,}-token window"
    )
    print(
        f"largest model input: {largest:,} tokens = {largest / WINDOW_TOKENS:.0%} of "
        f"the window ({len(calls)} calls, all under: {largest <= WINDOW_TOKENS}); "
        f"compactions: {kinds.get('compaction', 0)}"
    )
    print(f"entries: {len(log):,} ({', '.join(f'{k} {v}' for k, v in kinds.items())})")
    print(
        f"incremental rebuild per write: p50 {percentile(log_ms, 50):.3f} ms, "
        f"p99 {percentile(log_ms, 99):.3f} ms (baseline, whole step between "
        f"model calls: p50 {percentile(gaps, 50):.1f} ms)"
    )
    points = stored_bytes(run.id)
    print(
        "stored bytes/entry at "
        + ", ".join(f"{n:,}: {b:.0f}" for n, b in points)
        + f" (first to last: {points[-1][1] / points[0][1]:.2f}x)"
    )
    rebuild_ms, decode_ms, read_ms, entries = rebuild_at(REBUILD_ENTRIES, run)
    print(
        f"full rebuild from the leaf at {entries:,} entries: {rebuild_ms:.2f} ms "
        f"(p50 of {REBUILD_ROUNDS}; baseline, decoding the checkpoint's messages: "
        f"{decode_ms:.2f} ms); reading the run's {len(log):,} stored entries: "
        f"{read_ms:.1f} ms"
    )


if __name__ == "__main__":
    main()
