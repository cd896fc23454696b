"""The demo shop's tables: the world the Kettlecraft agent acts on.

They began in the `runs` app; `db_table` keeps the original table names so the move
changed no data (shop/migrations/0001_initial.py).
"""

from __future__ import annotations

from decimal import Decimal

from django.db import models

from controlplane.models import Tenant


class ShopOrder(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    order_id = models.CharField(max_length=4)
    customer = models.CharField(max_length=200)
    item = models.CharField(max_length=200)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=32, default="delivered")
    damaged = models.BooleanField(default=False)
    delivery_date = models.DateField(null=True, blank=True)

    class Meta:
        db_table = "runs_shoporder"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "order_id"], name="order_per_tenant"
            )
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
