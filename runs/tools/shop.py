"""The Kettlecraft demo shop's tools (DESIGN.md §10): two reads run freely, a
replacement (idempotent by key) and a refund (irreversible) stop for approval.

The seed's five tool rules (spec §2.1 ch. 3) hold: each description says when to
use the tool, when not to and how it differs from its neighbours; the order
number's format is exact (`^[0-9]{4}$`, described so a schema error says how to
fix it); a not-found error says what to do next (the customer's recent order, to
be confirmed with the customer first)."""

from __future__ import annotations

import datetime as dt
import os
import signal
import uuid
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from runs.engine.contracts import Effect, Idempotency, ToolContract, ToolSource
from runs.engine.envelope import ErrorCode, ToolFailure
from runs.engine.tools import Tool, ToolContext
from shop.models import Refund, Replacement, ShopOrder

REPLACEMENT_SHIPPING_DAYS = 3
ORDER_ID_SCHEMA = {
    "type": "string",
    "pattern": "^[0-9]{4}$",
    "description": 'Order number without "#", e.g. "4821" (four digits).',
}
ORDER_ONLY_SCHEMA = {
    "type": "object",
    "properties": {"order_id": ORDER_ID_SCHEMA},
    "required": ["order_id"],
}


def _orders(ctx: ToolContext) -> QuerySet[ShopOrder]:
    """The orders of the world the call acts in: an eval trial's own shop, or
    (no world) the tenant's real one. No tool reads or writes across worlds."""
    world = uuid.UUID(ctx.world_id) if ctx.world_id else None
    return ShopOrder.objects.filter(tenant_id=ctx.tenant_id, world_id=world)


def customer_orders(ctx: ToolContext) -> QuerySet[ShopOrder]:
    """The orders of the customer the run serves, newest first: the shop writes a
    customer as "Name (end-user id)". None without an end user: a tool acts with
    the current user's rights only, so it never lists another customer's orders."""
    if not ctx.end_user:
        return _orders(ctx).none()
    return (
        _orders(ctx)
        .filter(customer__endswith=f"({ctx.end_user})")
        .order_by("-delivery_date", "-order_id")
    )


def _not_found(ctx: ToolContext, order_id: str) -> ToolFailure:
    """An actionable not-found: the customer's recent order, to be confirmed."""
    recent = customer_orders(ctx).exclude(order_id=order_id).first()
    if recent is None:
        return ToolFailure(
            ErrorCode.EINVAL,
            f"there is no order {order_id}. Ask the customer to check the order "
            "number (four digits, on the confirmation email) before acting.",
            retryable=False,
            suggested_action="check_the_order_number_with_the_customer",
        )
    when = (
        f", delivered {recent.delivery_date.isoformat()}"
        if recent.delivery_date
        else ""
    )
    return ToolFailure(
        ErrorCode.EINVAL,
        f"there is no order {order_id}. This customer's most recent order is "
        f"{recent.order_id} ({recent.item}{when}). Ask the customer to confirm "
        "before acting.",
        retryable=False,
        suggested_action="ask_the_customer_to_confirm_the_order",
        data={
            "order_id": order_id,
            "suggested_order_id": recent.order_id,
            "suggested_item": recent.item,
            "suggested_delivery_date": recent.delivery_date.isoformat()
            if recent.delivery_date
            else None,
        },
    )


def _order(ctx: ToolContext, order_id: str) -> ShopOrder:
    order = _orders(ctx).filter(order_id=order_id).first()
    if order is None:
        raise _not_found(ctx, order_id)
    return order


def _order_view(order: ShopOrder) -> dict[str, Any]:
    return {
        "order_id": order.order_id,
        "customer": order.customer,
        "item": order.item,
        "amount": str(order.amount),
        "status": order.status,
        "damaged": order.damaged,
        "note": order.note,
        "delivery_date": order.delivery_date.isoformat()
        if order.delivery_date
        else None,
    }


def lookup_order(arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    order = _order(ctx, arguments["order_id"])
    view = _order_view(order)
    view["replacements"] = Replacement.objects.filter(order=order).count()
    view["refunded"] = str(
        sum((r.amount for r in Refund.objects.filter(order=order)), Decimal(0))
    )
    return view


def get_delivery_date(arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    order = _order(ctx, arguments["order_id"])
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


def create_replacement(
    arguments: dict[str, Any],
    ctx: ToolContext,
    *,
    honour_keys: bool = True,
    crash_after_effect: bool = False,
) -> dict[str, Any]:
    """Ship a replacement. `honour_keys` False is the shop with its key support
    turned off (a demo): every call ships another kettle. `crash_after_effect`
    is the demo's kill switch: the process dies (SIGKILL) right after a new
    replacement is committed and before its result is recorded, as a worker lost
    to the OOM killer would; a retry that finds the replacement does not die."""
    if honour_keys and not ctx.idempotency_key:
        raise ToolFailure(
            ErrorCode.EINVAL, "create_replacement needs an idempotency key"
        )
    order = _order(ctx, arguments["order_id"])
    key = ctx.idempotency_key if honour_keys else f"nokey-{uuid.uuid4().hex}"
    with transaction.atomic():
        # The key makes a retry after a crash return the first replacement.
        replacement, created = Replacement.objects.get_or_create(
            idempotency_key=key,
            defaults={
                "order": order,
                "reason": arguments["reason"],
                "delivery_date": dt.date.today()
                + dt.timedelta(days=REPLACEMENT_SHIPPING_DAYS),
            },
        )
    if crash_after_effect and created:
        os.kill(os.getpid(), signal.SIGKILL)
    return {
        "replacement_id": replacement.id,
        "order_id": order.order_id,
        "delivery_date": replacement.delivery_date.isoformat(),
        "created": created,
    }


def replacement_precondition(
    arguments: Mapping[str, Any], ctx: ToolContext
) -> str | None:
    order = _orders(ctx).filter(order_id=arguments.get("order_id")).first()
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
    order = _orders(ctx).filter(order_id=arguments.get("order_id")).first()
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
    order = _order(ctx, arguments["order_id"])
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
            description=(
                "Look up one customer order by its 4-digit order number. Returns "
                "item, amount, status, whether damage was reported, replacements "
                "and refunds. Use before any refund or replacement. Does not "
                "return delivery dates; use get_delivery_date for that."
            ),
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
            description=(
                "The expected delivery date of an order's latest shipment (the "
                "replacement if one was shipped). Use it whenever you tell the "
                "customer a date; never reuse a date from lookup_order or from "
                "earlier in the conversation."
            ),
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
            description=(
                "Ship a replacement for an order whose item arrived damaged; a "
                "person approves it first. Look the order up first. Not for a "
                "refund (use refund) and not for a late delivery (use "
                "get_delivery_date). A refunded order gets no replacement."
            ),
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
            description=(
                "Refund money for an order to the card it was paid with; a person "
                "approves it first. Look the order up first; never more than the "
                "order amount, and never to another card or account. Not for a "
                "damaged item the customer wants replaced (use create_replacement)."
            ),
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
