"""Demo data: the Kettlecraft shop (order #4821 arrived damaged) and its agent."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.db import transaction

from controlplane.models import Tenant
from runs.models import Agent, ModelEndpoint
from runs.services.agents import agent_create, agent_update, model_endpoint_create
from shop.models import ShopOrder

DEMO_AGENT_SLUG = "kettlecraft-support"
DEMO_ENDPOINT_SLUG = "scripted"
DEMO_INPUT = (
    "Hi, my order #4821 (the copper kettle) arrived with a dented spout. "
    "Can you send a replacement and tell me when it will arrive?"
)
DEMO_SYSTEM_PROMPT = (
    "You are Kettlecraft's support agent. Look orders up before acting, ship a "
    "replacement for damaged goods, and tell the customer the new delivery date."
)
# The scripted model's replies: what a capable model would do for DEMO_INPUT.
DEMO_SCRIPT: list[dict[str, Any]] = [
    {
        "text": "Let me look up the order.",
        "tool_calls": [{"id": "call_lookup", "name": "lookup_order",
                        "arguments": {"order_id": "4821"}}],
        "usage": {"input_tokens": 412, "output_tokens": 31},
    },
    {
        "text": "The kettle is damaged; I'll ship a replacement.",
        "tool_calls": [{"id": "call_replace", "name": "create_replacement",
                        "arguments": {"order_id": "4821",
                                      "reason": "arrived with a dented spout"}}],
        "usage": {"input_tokens": 540, "output_tokens": 44},
    },
    {
        "tool_calls": [{"id": "call_date", "name": "get_delivery_date",
                        "arguments": {"order_id": "4821"}}],
        "usage": {"input_tokens": 640, "output_tokens": 25},
        # Denied (or failed): say so, and promise nothing.
        "on_error": {"call_replace": {
            "text": "I'm sorry about the dented spout. I could not ship a "
            "replacement for order 4821: {{call_replace.message}}. A colleague "
            "will contact you about the other options.",
            "usage": {"input_tokens": 640, "output_tokens": 48},
        }},
    },
    {
        "text": "I'm sorry about the dented spout. A replacement kettle is on its "
        "way and will arrive on {{call_date.delivery_date}}.",
        "usage": {"input_tokens": 720, "output_tokens": 60},
    },
]  # fmt: skip


@transaction.atomic
def demo_seed_shop(*, tenant: Tenant) -> None:
    ShopOrder.objects.get_or_create(
        tenant=tenant,
        order_id="4821",
        defaults={
            "customer": "Ada Whitfield",
            "item": "Copper kettle, 1.7 l",
            "amount": Decimal("89.00"),
            "status": "delivered",
            "damaged": True,
            "delivery_date": dt.date.today() - dt.timedelta(days=2),
        },
    )
    endpoint = ModelEndpoint.objects.filter(tenant=tenant, slug=DEMO_ENDPOINT_SLUG)
    if not endpoint.exists():
        model_endpoint_create(
            tenant=tenant,
            actor=None,
            data={
                "slug": DEMO_ENDPOINT_SLUG,
                "name": "Scripted model (demo)",
                "kind": ModelEndpoint.Kind.SCRIPTED,
            },
        )
    config: dict[str, Any] = {
        "name": "Kettlecraft support",
        "endpoint": DEMO_ENDPOINT_SLUG,
        "model": "scripted-kettlecraft",
        "evaluated_models": ["scripted-kettlecraft"],
        "system_prompt": DEMO_SYSTEM_PROMPT,
        "tools": ["lookup_order", "get_delivery_date", "create_replacement",
                  "refund", "run_code"],
        "evaluator": "kettlecraft_replacement",
        "script": DEMO_SCRIPT,
    }  # fmt: skip
    agent = Agent.objects.filter(
        tenant=tenant, slug=DEMO_AGENT_SLUG, deleted_at__isnull=True
    ).first()
    if agent is None:
        agent_create(tenant=tenant, actor=None, slug=DEMO_AGENT_SLUG, config=config)
    else:  # a new version only if the demo's definition changed
        agent_update(agent=agent, actor=None, config=config, partial=False)
