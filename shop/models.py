"""The demo shop's tables: the world the Kettlecraft agent acts on.

They began in the `runs` app; `db_table` keeps the original table names so the move
changed no data (shop/migrations/0001_initial.py).
"""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.db import models

from controlplane.models import Tenant


class ShopWorld(models.Model):
    """A shop of its own: the scope an eval trial's orders, replacements and
    refunds live in, so trials never see each other's effects or the tenant's
    real shop (whose rows have no world). A run acts in one when its `world_id`
    names it (runs.Run.world_id)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    label = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"shop world {self.label or self.id}"


class ShopOrder(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    # None: the tenant's real shop; otherwise the world (an eval trial's) it is in.
    world = models.ForeignKey(
        ShopWorld, null=True, blank=True, on_delete=models.CASCADE
    )
    order_id = models.CharField(max_length=4)
    customer = models.CharField(max_length=200)
    item = models.CharField(max_length=200)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=32, default="delivered")
    damaged = models.BooleanField(default=False)
    delivery_date = models.DateField(null=True, blank=True)
    # What the customer wrote with the order: text from outside, which an agent
    # reads as data (the demo suite puts a prompt injection here).
    note = models.TextField(blank=True)

    class Meta:
        db_table = "runs_shoporder"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "order_id"],
                condition=models.Q(world__isnull=True),
                name="order_per_tenant",
            ),
            models.UniqueConstraint(
                fields=["world", "order_id"],
                condition=models.Q(world__isnull=False),
                name="order_per_world",
            ),
        ]

    def __str__(self) -> str:
        return f"order {self.order_id}"


class Replacement(models.Model):
    """One replacement shipment; the idempotency key makes a retried create a no-op."""

    order = models.ForeignKey(ShopOrder, on_delete=models.CASCADE)
    idempotency_key = models.CharField(max_length=64, unique=True)
    reason = models.CharField(max_length=500)
    delivery_date = models.DateField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "runs_replacement"

    def __str__(self) -> str:
        return f"replacement for {self.order.order_id}"


class Refund(models.Model):
    """A refund: irreversible and, like many payment APIs, not idempotent."""

    order = models.ForeignKey(ShopOrder, on_delete=models.CASCADE)
    amount = models.DecimalField(max_digits=10, decimal_places=2, default=Decimal(0))
    reason = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "runs_refund"

    def __str__(self) -> str:
        return f"refund {self.amount} for {self.order.order_id}"
