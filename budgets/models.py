"""Tenant budgets, their period counters, the ledger, grants and the model price table.

The tables keep the names they had in the controlplane app (`db_table`): the
models moved to this app by a state-only migration, no data moved.
"""

from __future__ import annotations

import os
import time
import uuid
from decimal import Decimal

from django.db import models

from controlplane.models import Tenant

# The period dimensions a tenant can limit, per day and per month.
PERIOD_DIMENSIONS = ("input_tokens", "output_tokens", "cost", "runs")
PERIODS = ("day", "month")


class Budget(models.Model):
    """A tenant's limits: per period, per run (the ceiling) and concurrent runs.

    `period_limits` is `{"day": {dimension: limit}, "month": {...}}`; a missing
    dimension has no limit. `run_caps` uses the engine's BudgetLimits keys.
    """

    class PeriodMode(models.TextChoices):
        CALENDAR = "calendar"  # the UTC day / month
        ROLLING = "rolling"  # the last 24 hours / 30 days, in hour / day buckets

    class OnExhausted(models.TextChoices):
        STOP = "stop"  # a refused reservation ends the run budget_exhausted
        ASK = "ask"  # it asks for an approval "extend <dimension> by X" instead

    tenant = models.OneToOneField(
        Tenant, on_delete=models.CASCADE, related_name="budget"
    )
    period_mode = models.CharField(
        max_length=16, choices=PeriodMode.choices, default=PeriodMode.CALENDAR
    )
    period_limits = models.JSONField(default=dict)
    # The same shape per end user a run serves (`Run.end_user`): each end user's
    # runs together stay within these, besides the tenant's own limits. With
    # any set, a run must name its end user (docs/budgets.md).
    end_user_limits = models.JSONField(default=dict, blank=True)
    run_caps = models.JSONField(default=dict)
    max_concurrent_runs = models.PositiveIntegerField(null=True, blank=True)
    allow_unknown_price = models.BooleanField(default=False)
    on_exhausted = models.CharField(
        max_length=8, choices=OnExhausted.choices, default=OnExhausted.STOP
    )
    # The step of an extension per period dimension or run cap ("cost": "5",
    # "max_steps": 10); a missing one extends by the current limit again.
    extend_by = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "controlplane_budget"

    def __str__(self) -> str:
        return f"budget of {self.tenant}"


class BudgetCounter(models.Model):
    """Use and reservations of one tenant in one period bucket, in one slot.

    Calendar mode has one bucket per UTC day and per UTC month; rolling mode has
    hour buckets (summed over 24 hours) and day buckets (summed over 30 days).
    A calendar bucket is split into slot rows (budgets/ledger.py: `SLOTS`), each
    holding a share of the headroom in its `quota_*` columns, divided from the
    limits in `quota_limits`; the bucket's use is the sum of its slots. Rolling
    mode writes slot 0 only.
    """

    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="budget_counters"
    )
    period = models.CharField(max_length=8)  # day | month
    bucket_start = models.DateTimeField()
    slot = models.PositiveSmallIntegerField(default=0)
    used_input_tokens = models.BigIntegerField(default=0)
    reserved_input_tokens = models.BigIntegerField(default=0)
    used_output_tokens = models.BigIntegerField(default=0)
    reserved_output_tokens = models.BigIntegerField(default=0)
    used_cost = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal(0))
    reserved_cost = models.DecimalField(
        max_digits=18, decimal_places=6, default=Decimal(0)
    )
    used_runs = models.BigIntegerField(default=0)
    reserved_runs = models.BigIntegerField(default=0)
    # The slot's share: its use plus a part of the bucket's headroom (null: no
    # limit on the dimension). The shares add up to the limit in `quota_limits`
    # (the budget's `period_limits` they were divided from); a slot whose
    # `quota_limits` differ from the budget's (or are null) is not used until
    # the bucket is divided again under the budget's lock.
    quota_input_tokens = models.BigIntegerField(null=True, blank=True)
    quota_output_tokens = models.BigIntegerField(null=True, blank=True)
    quota_cost = models.DecimalField(
        max_digits=30, decimal_places=6, null=True, blank=True
    )
    quota_runs = models.BigIntegerField(null=True, blank=True)
    quota_limits = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "controlplane_budgetcounter"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "period", "bucket_start", "slot"],
                name="one_budget_counter_per_bucket_slot",
            )
        ]

    def __str__(self) -> str:
        start = f"{self.bucket_start:%Y-%m-%d %H:%M}"
        return f"{self.tenant} {self.period} {start} slot {self.slot}"


class EndUserBudgetCounter(models.Model):
    """Use and reservations of one end user of a tenant in one period bucket.

    One row per bucket (no slots: one end user's runs rarely contend). It is
    locked after the tenant's counters by every ledger write, the one lock
    order (budgets/ledger.py).
    """

    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="end_user_budget_counters"
    )
    end_user = models.CharField(max_length=128)
    period = models.CharField(max_length=8)  # day | month
    bucket_start = models.DateTimeField()
    used_input_tokens = models.BigIntegerField(default=0)
    reserved_input_tokens = models.BigIntegerField(default=0)
    used_output_tokens = models.BigIntegerField(default=0)
    reserved_output_tokens = models.BigIntegerField(default=0)
    used_cost = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal(0))
    reserved_cost = models.DecimalField(
        max_digits=18, decimal_places=6, default=Decimal(0)
    )
    used_runs = models.BigIntegerField(default=0)
    reserved_runs = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "end_user", "period", "bucket_start"],
                name="one_end_user_budget_counter_per_bucket",
            )
        ]

    def __str__(self) -> str:
        return (
            f"{self.tenant} {self.end_user} {self.period} {self.bucket_start:%Y-%m-%d}"
        )


def time_ordered_uuid() -> uuid.UUID:
    """A UUIDv7 (RFC 9562): milliseconds since the epoch, then random bits.

    Ledger keys grow with time, so inserts land on the right edge of the primary
    key index instead of a random page (less to write after each checkpoint).
    """
    millis = time.time_ns() // 1_000_000
    value = (millis & (1 << 48) - 1) << 80 | int.from_bytes(os.urandom(10), "big")
    value = value & ~(0xF << 76) | 0x7 << 76  # version 7
    value = value & ~(0x3 << 62) | 0x2 << 62  # the RFC variant
    return uuid.UUID(int=value)


class BudgetLedgerEntry(models.Model):
    """One reservation and how it ended (settled with actual use, or released)."""

    class Kind(models.TextChoices):
        MODEL_CALL = "model_call"
        TOOL_CALL = "tool_call"
        RUN = "run"

    class Status(models.TextChoices):
        RESERVED = "reserved"
        SETTLED = "settled"
        RELEASED = "released"

    id = models.UUIDField(primary_key=True, default=time_ordered_uuid, editable=False)
    # No database constraint: with one, every insert takes a key-share lock on the
    # tenant row, and concurrent writers of one tenant contend on it (multixacts).
    # Deleting a tenant still cascades here (Django does the cascade).
    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.CASCADE,
        related_name="budget_ledger",
        db_constraint=False,
        db_index=False,  # read by run; a tenant's deletion may scan
    )
    # No foreign key: runs depends on controlplane, not the other way round.
    # The only index besides the key: settling changes no indexed column, so on
    # PostgreSQL it is a HOT update (the table keeps free space for it).
    run_id = models.UUIDField(db_index=True)
    step_index = models.IntegerField(null=True, blank=True)
    call_id = models.CharField(max_length=128, blank=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.RESERVED
    )
    reserved = models.JSONField(default=dict)  # {input_tokens, output_tokens, cost}
    actual = models.JSONField(null=True, blank=True)
    counter_ids = models.JSONField(default=list)  # [day slot, month slot] counters
    # The end user's counters it also reserved on (EndUserBudgetCounter ids);
    # null for none (ledger_sql inserts without this column).
    end_user_counter_ids = models.JSONField(null=True, blank=True)
    # Dimensions reserved from the run's grants instead of the counters:
    # [{"grant": id, "period": "day", "dimension": "cost"}].
    funding = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    # An external agent's reservation (POST /api/v1/budget/reservations/) is
    # released by beat when still open at this time; a run's own step never
    # expires (recovery releases what a lost step held).
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "controlplane_budgetledgerentry"
        indexes = [
            # Partial on a column no settle changes: settling stays a HOT
            # update on PostgreSQL, and the index holds external entries only.
            models.Index(
                fields=["expires_at"],
                condition=models.Q(expires_at__isnull=False),
                name="ledger_entry_expiry",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.status} for run {self.run_id}"


class BudgetGrant(models.Model):
    """A run's own extension of one period limit in one bucket (approved).

    When the tenant's limit refuses the run, the dimension is reserved from here
    instead (never beyond `amount`); every other run still sees the tenant's
    limit, so the period's total stays within the limit plus the grants.
    Who approved how much is in the audit log (`budget.extend`).
    """

    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.CASCADE,
        related_name="budget_grants",
        db_constraint=False,  # as the ledger: no key-share lock on the tenant row
    )
    run_id = models.UUIDField()
    period = models.CharField(max_length=8)  # day | month
    bucket_start = models.DateTimeField()
    dimension = models.CharField(max_length=16)  # input_tokens | output_tokens | cost
    amount = models.DecimalField(max_digits=18, decimal_places=6)
    used = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal(0))
    reserved = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal(0))
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "controlplane_budgetgrant"
        constraints = [
            models.UniqueConstraint(
                fields=["run_id", "period", "bucket_start", "dimension"],
                name="one_budget_grant_per_run_bucket_dimension",
            )
        ]

    def __str__(self) -> str:
        return f"+{self.amount} {self.dimension} per {self.period} for {self.run_id}"


class ModelPriceEntry(models.Model):
    """Price per million tokens for a model; a tenant row overrides the global one."""

    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.CASCADE,
        related_name="model_prices",
        null=True,
        blank=True,
    )
    model = models.CharField(max_length=200)
    input_per_million = models.DecimalField(max_digits=12, decimal_places=6)
    cached_input_per_million = models.DecimalField(max_digits=12, decimal_places=6)
    output_per_million = models.DecimalField(max_digits=12, decimal_places=6)
    # The model's context window in tokens (null: unknown, so a run compacts its
    # context only when the provider reports an overflow; runs.services.compaction).
    context_window_tokens = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "controlplane_modelpriceentry"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "model"], name="one_price_per_model_and_tenant"
            )
        ]

    def __str__(self) -> str:
        return f"{self.model} ({self.tenant or 'global'})"


class ToolQuotaCounter(models.Model):
    """Calls of one tool quota bucket by one tenant in one period window (a tool
    contract's `cost.quota`, e.g. "100/day"; budgets/quotas.py). A call is taken
    by a conditional increment of `used`, so concurrent workers never exceed the
    limit."""

    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="tool_quota_counters"
    )
    bucket = models.CharField(max_length=64)  # the tool's name or a shared bucket
    period = models.CharField(max_length=8)  # minute | hour | day | week
    window_start = models.DateTimeField()
    used = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "bucket", "period", "window_start"],
                name="one_tool_quota_counter_per_window",
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant} {self.bucket} per {self.period} {self.window_start}"
