"""Writes to the demo shop that are not a tool's: fresh worlds for eval trials
and demo scripts (and their removal once no run acts in them), and a refund
made outside any run."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from controlplane.models import Tenant
from shop.models import Refund, ShopOrder, ShopWorld

__all__ = [
    "shop_order_refund_in_full",
    "shop_world_create",
    "shop_worlds_create",
    "shop_worlds_purge",
]


@transaction.atomic
def shop_worlds_create(
    *, tenant: Tenant, orders: Sequence[Mapping[str, Any]], labels: Sequence[str]
) -> list[ShopWorld]:
    """One new world per label, each holding exactly `orders` (a case's
    `world.orders`, checked by runs.evals.definitions): `delivered_days_ago`
    becomes a delivery date counted from today, so a world made today reads as
    the case says. Two statements however many worlds: an eval run makes one
    for each trial of a case before any of them starts."""
    worlds = ShopWorld.objects.bulk_create(
        ShopWorld(tenant=tenant, label=label[:200]) for label in labels
    )
    today = dt.date.today()
    ShopOrder.objects.bulk_create(
        ShopOrder(
            tenant=tenant,
            world=world,
            order_id=order["order_id"],
            customer=order["customer"],
            item=order["item"],
            amount=Decimal(str(order["amount"])),
            status=order.get("status") or "delivered",
            damaged=bool(order.get("damaged", False)),
            note=order.get("note", ""),
            delivery_date=(
                today - dt.timedelta(days=order["delivered_days_ago"])
                if "delivered_days_ago" in order
                else None
            ),
        )
        for world in worlds
        for order in orders
    )
    return worlds


def shop_world_create(
    *, tenant: Tenant, orders: Sequence[Mapping[str, Any]], label: str = ""
) -> ShopWorld:
    """One new world holding exactly `orders` (see shop_worlds_create)."""
    return shop_worlds_create(tenant=tenant, orders=orders, labels=[label])[0]


def shop_worlds_purge(
    *, tenant: Tenant, made_before: dt.datetime, in_use: QuerySet[Any]
) -> int:
    """Delete the tenant's worlds made before `made_before` that no run acts in
    (`in_use`: the world ids runs name), with their orders, replacements and
    refunds. Returns how many worlds went."""
    unused = ShopWorld.objects.filter(tenant=tenant, created_at__lt=made_before)
    deleted = unused.exclude(id__in=in_use).delete()[1]
    return deleted.get(ShopWorld._meta.label, 0)


@transaction.atomic
def shop_order_refund_in_full(*, order: ShopOrder, reason: str) -> Refund | None:
    """Refund what is left of the order's amount (finance acting outside any
    run: the late-approval demo's "meanwhile"); None when nothing is left."""
    locked = ShopOrder.objects.select_for_update().get(pk=order.pk)
    refunded = sum((r.amount for r in Refund.objects.filter(order=locked)), Decimal(0))
    left = locked.amount - refunded
    if left <= 0:
        return None
    return Refund.objects.create(order=locked, amount=left, reason=reason[:500])
