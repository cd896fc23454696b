"""The verdict of one phase, read from the database: every run terminal and
correct, side effects not repeated, WebSocket logs equal to the stored log."""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from django.db.models import Count, Min
from django.utils import timezone

from runs.models import Run, ToolCall
from shop.models import Refund, Replacement
from soak.traffic import Follower, RunRecord, Tally, db_retry
from tracing.models import RunEvent

RECOVERY_TARGET_SECONDS = 20.0
# Without a fault nothing is lost, so every re-enqueue by recovery is needless;
# issue 24 allows at most one per run per hour of its life, counted run by run
# (runs.services.recovery logs each). A step a worker holds prefetched past the
# enqueue grace is re-enqueued once, harmlessly: its old token is then stale.
NEEDLESS_RE_ENQUEUES_PER_RUN_HOUR = 1.0
RE_ENQUEUED = re.compile(r"run ([0-9a-f-]{36}): its step was lost; enqueued it again")


@dataclass
class PhaseResult:
    fault: str
    runs: int = 0
    lost: int = 0
    duplicates: int = 0
    committed_5xx: int = 0
    ws_clients: int = 0
    ws_mismatches: int = 0
    recovery: float | None = None  # None: no fault (or nothing in flight)
    # Steps of this phase's runs that recovery enqueued again, and the hours
    # those runs lived (created to finished, or to the check).
    re_enqueues: int = 0
    runs_over: int = 0  # runs re-enqueued more than once per hour they lived
    in_flight: int = 0
    fault_note: str = ""
    details: list[str] = field(default_factory=list)

    def missed(self) -> list[str]:
        missed = []
        if self.lost:
            missed.append(f"{self.fault}: {self.lost} runs lost (target 0)")
        if self.duplicates:
            missed.append(
                f"{self.fault}: {self.duplicates} duplicate side effects (target 0)"
            )
        if self.committed_5xx:
            missed.append(
                f"{self.fault}: {self.committed_5xx} 5xx for committed work (target 0)"
            )
        if self.ws_mismatches:
            missed.append(
                f"{self.fault}: {self.ws_mismatches} of {self.ws_clients} WebSocket "
                "clients' seq lists differ from the stored log (target 0)"
            )
        if self.recovery is not None and not self.recovery <= RECOVERY_TARGET_SECONDS:
            shown = "never" if math.isinf(self.recovery) else f"{self.recovery:.1f} s"
            missed.append(
                f"{self.fault}: recovery {shown} "
                f"(target <= {RECOVERY_TARGET_SECONDS:.0f} s)"
            )
        if self.fault == "none" and self.runs_over:
            missed.append(
                f"none: {self.runs_over} runs re-enqueued needlessly more than "
                f"{NEEDLESS_RE_ENQUEUES_PER_RUN_HOUR:.0f} per hour of their life"
            )
        return missed


def terminal_of(run_ids: list[str]) -> dict[str, bool]:
    terminal = {str(s) for s in Run.TERMINAL}
    return db_retry(
        lambda: {
            str(run_id): status in terminal
            for run_id, status in Run.objects.filter(id__in=run_ids).values_list(
                "id", "status"
            )
        }
    )


def advanced_since(run_ids: list[str], moment: dt.datetime) -> dict[str, dt.datetime]:
    """The runs that advanced after `moment`, each with when it first did: its
    first event after `moment` written by a worker (approval events are the
    web's), or its end. A process killed at `moment` commits nothing later, so
    what it wrote before dying does not count as advancing again."""

    def read() -> dict[str, dt.datetime]:
        first: dict[str, dt.datetime] = {
            str(run_id): at
            for run_id, at in RunEvent.objects.filter(
                run_id__in=run_ids, created_at__gt=moment
            )
            .exclude(type__startswith="approval.")
            .values("run_id")
            .annotate(first=Min("created_at"))
            .values_list("run_id", "first")
        }
        for run_id, ended in Run.objects.filter(
            id__in=run_ids, finished_at__gt=moment
        ).values_list("id", "finished_at"):
            assert ended is not None
            first[str(run_id)] = min(first.get(str(run_id), ended), ended)
        return first

    return db_retry(read)


def check_runs(
    result: PhaseResult,
    records: list[RunRecord],
    *,
    since: dt.datetime,
    every_run: list[str],
) -> None:
    """Terminal and correct: approved runs succeeded with exactly one replacement
    from their own create_replacement call; denied ones failed with none.
    `every_run` is every run of the soak so far: a replacement made in this phase
    with a key none of their calls holds is a side effect nobody asked for."""
    started = [r for r in records if r.run_id]
    result.runs = len(started)
    ids = [r.run_id for r in started]
    runs = db_retry(lambda: {str(r.id): r for r in Run.objects.filter(id__in=ids)})
    calls = db_retry(
        lambda: list(
            ToolCall.objects.filter(
                run_id__in=ids, tool_name="create_replacement"
            ).values_list("run_id", "idempotency_key", "status")
        )
    )
    keys_of: dict[str, list[str]] = {}
    for run_id, key, _ in calls:
        keys_of.setdefault(str(run_id), []).append(key)
    replacements = Counter(
        db_retry(
            lambda: list(
                Replacement.objects.filter(created_at__gte=since).values_list(
                    "idempotency_key", flat=True
                )
            )
        )
    )
    wrong: Counter[str] = Counter()
    for record in started:
        run = runs.get(record.run_id)
        if run is None:
            result.lost += 1
            wrong["committed but not in the database"] += 1
            continue
        shipped = sum(replacements[k] for k in keys_of.get(record.run_id, []))
        if run.status not in Run.TERMINAL:
            result.lost += 1
            wrong[f"not terminal ({run.status})"] += 1
        elif record.deny and (run.status != Run.Status.FAILED or shipped):
            result.lost += 1
            wrong[f"denied but {run.status}/{run.stop_reason}, {shipped} shipped"] += 1
        elif not record.deny and (run.status != Run.Status.SUCCEEDED or shipped != 1):
            result.lost += 1
            wrong[
                f"approved but {run.status}/{run.stop_reason}, {shipped} shipped"
            ] += 1
        if len(keys_of.get(record.run_id, [])) > 1:
            result.duplicates += len(keys_of[record.run_id]) - 1
            wrong["create_replacement proposed twice"] += 1
    never = [r for r in records if not r.run_id]
    if never:
        result.lost += len(never)
        wrong["never started (the API refused every try)"] += len(never)
    for what, count in wrong.most_common():
        result.details.append(f"{count} runs: {what}")
    # Side effects with a key no call of the soak's runs holds, or twice for one.
    known = set(
        db_retry(
            lambda: list(
                ToolCall.objects.filter(
                    run_id__in=every_run, tool_name="create_replacement"
                ).values_list("idempotency_key", flat=True)
            )
        )
    )
    phase_keys = {k for k in replacements if k in known}
    orphans = sum(n for k, n in replacements.items() if k not in known)
    if orphans:
        result.duplicates += orphans
        result.details.append(
            f"{orphans} replacements with a key of no call of these runs"
        )
    twice = sum(n - 1 for k, n in replacements.items() if k in phase_keys and n > 1)
    result.duplicates += twice
    refunds = db_retry(lambda: Refund.objects.filter(created_at__gte=since).count())
    if refunds:
        # The demo never asks for a refund: any is a side effect nobody approved.
        result.duplicates += refunds
        result.details.append(f"{refunds} refunds (the demo makes none)")
    per_order = db_retry(
        lambda: list(
            Refund.objects.filter(created_at__gte=since)
            .values("order_id", "amount", "reason")
            .annotate(n=Count("id"))
            .filter(n__gt=1)
        )
    )
    if per_order:
        result.details.append(f"double refunds: {per_order}")


def re_enqueues_logged(logs: Iterable[Path], run_ids: Iterable[str]) -> Counter[str]:
    """How often recovery enqueued each of `run_ids` again, from the services'
    logs (the worker that ran the recovery pass logs every one)."""
    wanted = set(run_ids)
    counts: Counter[str] = Counter()
    for log in logs:
        with log.open(errors="replace") as lines:
            for line in lines:
                if "its step was lost" not in line:
                    continue
                match = RE_ENQUEUED.search(line)
                if match and match.group(1) in wanted:
                    counts[match.group(1)] += 1
    return counts


def check_re_enqueues(
    result: PhaseResult, counts: Counter[str], run_ids: list[str]
) -> None:
    """Count the phase's re-enqueues, and each run's against the hours it lived
    (a run of minutes may have one)."""
    now = timezone.now()
    lived = db_retry(
        lambda: list(
            Run.objects.filter(id__in=run_ids).values_list(
                "id", "created_at", "finished_at"
            )
        )
    )
    hours = {
        str(run_id): ((finished or now) - created).total_seconds() / 3600
        for run_id, created, finished in lived
    }
    result.runs_over = sum(
        1
        for run_id, count in counts.items()
        if count > NEEDLESS_RE_ENQUEUES_PER_RUN_HOUR * max(1.0, hours.get(run_id, 0.0))
    )
    result.re_enqueues = sum(counts.values())
    if result.re_enqueues:
        most = counts.most_common(1)[0][1]
        result.details.append(
            f"{result.re_enqueues} steps enqueued again by recovery, in "
            f"{len(counts)} runs (at most {most} in one run)"
        )


def stored_seqs(run_id: str) -> list[int]:
    return list(
        RunEvent.objects.filter(run_id=run_id)
        .order_by("seq")
        .values_list("seq", flat=True)
    )


def check_streams(result: PhaseResult, followers: list[Follower]) -> None:
    result.ws_clients = len(followers)
    for follower in followers:
        stored = db_retry(functools.partial(stored_seqs, follower.run_id))
        if follower.seqs != stored:
            result.ws_mismatches += 1
            result.details.append(
                f"WebSocket client of run {follower.run_id}: "
                f"{_difference(follower.seqs, stored)}"
                f" ({follower.connects} connections)"
            )
    handshakes = sum(f.failed_handshakes for f in followers)
    if handshakes:
        result.details.append(f"{handshakes} failed WebSocket handshakes (reconnected)")


def _difference(got: list[int], stored: list[int]) -> str:
    duplicated = sorted(s for s, n in Counter(got).items() if n > 1)
    missing = sorted(set(stored) - set(got))
    extra = sorted(set(got) - set(stored))
    parts = [f"got {len(got)} seqs, stored {len(stored)}"]
    if missing:
        parts.append(f"missing {_span(missing)}")
    if duplicated:
        parts.append(f"sent twice {_span(duplicated)}")
    if extra:
        parts.append(f"not in the log {_span(extra)}")
    if not (missing or duplicated or extra):
        parts.append("out of order")
    return ", ".join(parts)


def _span(values: list[int]) -> str:
    shown = ",".join(map(str, values[:8]))
    return shown + ("…" if len(values) > 8 else "")


def check_tally(result: PhaseResult, tally: Tally) -> None:
    result.committed_5xx = len(tally.committed_5xx)
    for what in tally.committed_5xx[:5]:
        result.details.append(f"5xx for committed work: {what}")
    if len(tally.committed_5xx) > 5:
        result.details.append(
            f"… and {len(tally.committed_5xx) - 5} more 5xx for committed work"
        )
    if tally.committed_dropped:
        result.details.append(
            f"{len(tally.committed_dropped)} requests committed whose connection "
            "dropped before the answer (not counted as 5xx)"
        )
    for what in tally.gave_up[:5]:
        result.details.append(f"client gave up: {what}")
    errors = {
        k: n for k, n in tally.statuses.items() if not k.endswith((" 200", " 201"))
    }
    if errors:
        shown = ", ".join(f"{k}: {n}" for k, n in sorted(errors.items()))
        result.details.append(f"answers other than 200/201: {shown}")


HEADERS = (
    "fault",
    "runs",
    "lost",
    "duplicates",
    "5xx-for-committed",
    "WS mismatches",
    "recovery s",
    "re-enqueued",
)


def table(results: list[PhaseResult]) -> str:
    rows = [HEADERS]
    for r in results:
        if r.recovery is None:
            recovery = "-"
        elif math.isinf(r.recovery):
            recovery = "never"
        else:
            recovery = f"{r.recovery:.1f}"
        rows.append(
            (
                r.fault,
                str(r.runs),
                str(r.lost),
                str(r.duplicates),
                str(r.committed_5xx),
                f"{r.ws_mismatches}/{r.ws_clients}",
                recovery,
                str(r.re_enqueues),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("| " + " | ".join(cells) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
