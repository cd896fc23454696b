"""The Kettlecraft demo shop's tools (DESIGN.md §10): two reads run freely, a
replacement (idempotent by key) and a refund (irreversible) stop for approval."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import transaction

from runs.engine.contracts import Effect, Idempotency, ToolContract, ToolSource
from runs.engine.envelope import ErrorCode, ToolFailure
from runs.engine.tools import Tool, ToolContext
from shop.models import Refund, Replacement, ShopOrder

REPLACEMENT_SHIPPING_DAYS = 3
ORDER_ID_SCHEMA = {
    "type": "string",
    "pattern": "^[0-9]{4}$",
    "description": "The four-digit order number, e.g. 4821.",
}
ORDER_ONLY_SCHEMA = {
    "type": "object",
    "properties": {"order_id": ORDER_ID_SCHEMA},
    "required": ["order_id"],
}


def _order(tenant_id: str, order_id: str) -> ShopOrder:
    order = ShopOrder.objects.filter(tenant_id=tenant_id, order_id=order_id).first()
    if order is None:
        raise ToolFailure(
            ErrorCode.EINVAL,
            f"there is no order {order_id}",
            retryable=False,
            suggested_action="check_the_order_number_with_the_customer",
        )
    return order


def _order_view(order: ShopOrder) -> dict[str, Any]:
    return {
        "order_id": order.order_id,
        "customer": order.customer,
        "item": order.item,
        "amount": str(order.amount),
        "status": order.status,
        "damaged": order.damaged,
        "delivery_date": order.delivery_date.isoformat()
        if order.delivery_date
        else None,
    }


def lookup_order(arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    order = _order(ctx.tenant_id, arguments["order_id"])
    view = _order_view(order)
    view["replacements"] = Replacement.objects.filter(order=order).count()
    view["refunded"] = str(
        sum((r.amount for r in Refund.objects.filter(order=order)), Decimal(0))
    )
    return view


def get_delivery_date(arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    order = _order(ctx.tenant_id, arguments["order_id"])
    replacement = (
        Replacement.objects.filter(order=order).order_by("-created_at").first()
    )
    if replacement is not None:
        return {
            "order_id": order.order_id,
            "shipment": "replacement",
            "delivery_date": replacement.delivery_date.isoformat(),
        }
    return {
        "order_id": order.order_id,
        "shipment": "original",
        "delivery_date": order.delivery_date.isoformat()
        if order.delivery_date
        else None,
    }


def create_replacement(arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    if not ctx.idempotency_key:
        raise ToolFailure(
            ErrorCode.EINVAL, "create_replacement needs an idempotency key"
        )
    order = _order(ctx.tenant_id, arguments["order_id"])
    with transaction.atomic():
        # The key makes a retry after a crash return the first replacement.
        replacement, created = Replacement.objects.get_or_create(
            idempotency_key=ctx.idempotency_key,
            defaults={
                "order": order,
                "reason": arguments["reason"],
                "delivery_date": dt.date.today()
                + dt.timedelta(days=REPLACEMENT_SHIPPING_DAYS),
            },
        )
    return {
        "replacement_id": replacement.id,
        "order_id": order.order_id,
        "delivery_date": replacement.delivery_date.isoformat(),
        "created": created,
    }


def replacement_precondition(
    arguments: Mapping[str, Any], ctx: ToolContext
) -> str | None:
    order = ShopOrder.objects.filter(
        tenant_id=ctx.tenant_id, order_id=arguments.get("order_id")
    ).first()
    if order is None:
        return f"there is no order {arguments.get('order_id')}"
    refunded = _refunded(order)
    if refunded >= order.amount:
        return (
            f"order {order.order_id} was refunded in full ({refunded} of "
            f"{order.amount}); a refunded order gets no replacement"
        )
    return None


def _refunded(order: ShopOrder) -> Decimal:
    return sum((r.amount for r in Refund.objects.filter(order=order)), Decimal(0))


def refund_precondition(arguments: Mapping[str, Any], ctx: ToolContext) -> str | None:
    order = ShopOrder.objects.filter(
        tenant_id=ctx.tenant_id, order_id=arguments.get("order_id")
    ).first()
    if order is None:
        return f"there is no order {arguments.get('order_id')}"
    try:
        amount = Decimal(str(arguments["amount"]))
    except (InvalidOperation, KeyError):
        return "amount must be a number"
    already = _refunded(order)
    if amount + already > order.amount:
        return (
            f"refunds may not exceed the order amount {order.amount} "
            f"(already refunded {already})"
        )
    return None


def refund(arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    order = _order(ctx.tenant_id, arguments["order_id"])
    created = Refund.objects.create(
        order=order,
        amount=Decimal(str(arguments["amount"])),
        reason=arguments["reason"],
    )
    return {
        "refund_id": created.id,
        "order_id": order.order_id,
        "amount": str(created.amount),
    }


def _contract(**fields: Any) -> ToolContract:
    return ToolContract(source=ToolSource.BUILTIN, **fields)


SHOP_TOOLS = [
    Tool(
        _contract(
            name="lookup_order",
            description="Look up a customer order: item, amount, status, damage.",
            input_schema=ORDER_ONLY_SCHEMA,
            effect=Effect.READ_ONLY,
            idempotency=Idempotency.NATURAL,
        ),
        lookup_order,
        timeout_seconds=None,
    ),
    Tool(
        _contract(
            name="get_delivery_date",
            description="The expected delivery date of an order's latest shipment.",
            input_schema=ORDER_ONLY_SCHEMA,
            effect=Effect.READ_ONLY,
            idempotency=Idempotency.NATURAL,
        ),
        get_delivery_date,
        timeout_seconds=None,
    ),
    Tool(
        _contract(
            name="create_replacement",
            description="Ship a replacement for a damaged order.",
            input_schema={
                "type": "object",
                "properties": {
                    "order_id": ORDER_ID_SCHEMA,
                    "reason": {"type": "string", "minLength": 3, "maxLength": 500},
                },
                "required": ["order_id", "reason"],
            },
            preconditions=("the order exists", "the order was not refunded in full"),
            effect=Effect.IDEMPOTENT_WRITE,
            idempotency=Idempotency.REQUIRED_KEY,
        ),
        create_replacement,
        check_preconditions=replacement_precondition,
        timeout_seconds=None,
    ),
    Tool(
        _contract(
            name="refund",
            description="Refund money for an order to the customer's card.",
            input_schema={
                "type": "object",
                "properties": {
                    "order_id": ORDER_ID_SCHEMA,
                    "amount": {"type": "number", "exclusiveMinimum": 0},
                    "reason": {"type": "string", "minLength": 3, "maxLength": 500},
                },
                "required": ["order_id", "amount", "reason"],
            },
            preconditions=("refunds never exceed the order amount",),
            effect=Effect.IRREVERSIBLE_EXTERNAL,
            idempotency=Idempotency.NONE,
            auth_scope="payments:refund",
        ),
        refund,
        check_preconditions=refund_precondition,
        timeout_seconds=None,
    ),
]
