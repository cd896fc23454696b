"""Keep the overview's hourly rollups (runs/rollups.py) as runs end.

A pass takes ended runs the rollups do not hold yet (`rollup_pending`), adds
each one's share to its hour's rows, takes back the share it held before (an
external run whose spans or settled spend arrive after it was counted), and
records on the run what the rollups now hold. Runs are locked while counted,
so two passes never count one twice and a change that lands meanwhile waits
and marks the run pending again. The rollups are metrics: deleting a run, by
hand or by retention, leaves its hour's counts as they were.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, models, transaction

from runs.models import Run, RunDurationRollup, RunHourRollup, ToolHourRollup
from runs.rollups import SHARE_FIELDS, RunShare, tool_shares

ROLLUP_BATCH = 2000


def runs_roll_up(*, batch: int = ROLLUP_BATCH) -> int:
    """Count up to `batch` ended pending runs into the rollups; how many."""
    with transaction.atomic():
        rows = list(
            Run.objects.select_for_update(skip_locked=True)
            .filter(rollup_pending=True, status__in=Run.TERMINAL)
            # In the pending index's order: a batch's runs share hours, so it
            # touches a few hundred rollup rows, not one per run.
            .order_by("tenant", "created_at")
            .values(*SHARE_FIELDS)[:batch]
        )
        if not rows:
            return 0
        runs: Counter[tuple[Any, ...]] = Counter()
        costs: defaultdict[tuple[Any, ...], Decimal] = defaultdict(Decimal)
        durations: Counter[tuple[Any, ...]] = Counter()
        # Runs by the histogram bucket the rollups now hold for them.
        marks: defaultdict[int | None, list[Any]] = defaultdict(list)
        first_held: dict[Any, tuple[Any, Any]] = {}
        for row in rows:
            share = RunShare.of(row)
            for sign, counted in ((1, share), (-1, RunShare.held(row))):
                if counted is None:
                    continue
                key = (row["tenant_id"], counted.hour, counted.agent_id)
                runs[(*key, counted.status)] += sign
                costs[(*key, counted.status)] += sign * counted.cost
                if counted.duration is not None:
                    durations[(key[0], counted.hour, counted.duration)] += sign
            if not row["rollup_status"]:
                first_held[row["id"]] = (row["tenant_id"], share.hour)
            marks[share.duration].append(row["id"])
        for (tenant_id, hour, agent_id, status), count in runs.items():
            _bump(
                RunHourRollup,
                {"tenant_id": tenant_id, "hour": hour, "agent_id": agent_id,
                 "status": status},
                runs=count, cost=costs[(tenant_id, hour, agent_id, status)],
            )  # fmt: skip
        for (tenant_id, hour, bucket), count in durations.items():
            _bump(
                RunDurationRollup,
                {"tenant_id": tenant_id, "hour": hour, "bucket": bucket},
                runs=count,
            )
        # A run's tool calls are counted once, when it is first held: only an
        # external run changes after it ended, and it has no tool call rows.
        for tools in tool_shares(first_held):
            tenant_id, hour = first_held[tools.run_id]
            _bump(
                ToolHourRollup,
                {"tenant_id": tenant_id, "hour": hour, "tool_name": tools.tool},
                calls=tools.calls, failed=tools.failed, cost=tools.cost,
            )  # fmt: skip
        # The rows are locked: their status and cost are what was counted.
        for duration, ids in marks.items():
            Run.objects.filter(pk__in=ids).update(
                rollup_pending=False,
                rollup_status=models.F("status"),
                rollup_cost=models.F("cost"),
                rollup_duration=duration,
            )
    return len(rows)


def runs_roll_up_all(*, batch: int = ROLLUP_BATCH, most: int = 50) -> int:
    """Passes until no ended run is pending (at most `most` of them)."""
    counted = 0
    for _ in range(most):
        done = runs_roll_up(batch=batch)
        counted += done
        if done < batch:
            break
    return counted


def _bump(model: type[models.Model], key: dict[str, Any], **amounts: Any) -> None:
    """Add `amounts` to the row at `key`, creating it at zero first."""
    if not any(amounts.values()):
        return
    increments = {name: models.F(name) + value for name, value in amounts.items()}
    if model._default_manager.filter(**key).update(**increments):
        return
    try:
        with transaction.atomic():
            model._default_manager.create(**key, **amounts)
    except IntegrityError:  # another pass created it meanwhile
        model._default_manager.filter(**key).update(**increments)
