"""Demo data: the Kettlecraft shop (order #4821 arrived damaged), its customer
`c-8812`, and the agents the eleven demo scripts run (runs/demo_scripts.py,
docs/demo.md), all on the scripted model: no API key needed.

Every agent is a scripted model's replies: what a capable model would do for
the script's message. A reply that depends on how a call went (approved or
denied, and why) has an `on_error` branch, so the answer is true on every path.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.db import transaction

from controlplane.models import Tenant
from runs.memory import memory_create, memory_scope
from runs.models import Agent, EvalSuite, ModelEndpoint
from runs.services.agents import agent_create, agent_update, model_endpoint_create
from runs.services.evals import eval_suite_create
from shop.models import ShopOrder

DEMO_AGENT_SLUG = "kettlecraft-support"
DEMO_ENDPOINT_SLUG = "scripted"
DEMO_CUSTOMER = "c-8812"
# The shop writes a customer as "Name (end-user id)": how a tool finds the
# orders of the customer a run serves (runs.tools.shop.customer_orders).
DEMO_CUSTOMER_NAME = f"Ada Whitfield ({DEMO_CUSTOMER})"
DEMO_INPUT = (
    "Hi, my order #4821 (the copper kettle) arrived with a dented spout. "
    "Can you send a replacement and tell me when it will arrive?"
)
DEMO_SYSTEM_PROMPT = (
    "You are Kettlecraft's support agent. Be brief and kind. Look orders up "
    "before acting, ship a replacement for damaged goods, and tell the customer "
    "the new delivery date (always from get_delivery_date)."
)
DEMO_TOOLS = [
    "lookup_order", "get_delivery_date", "create_replacement", "refund", "run_code",
]  # fmt: skip
# Order 4821 and an older one: the not-found script's "recent order" is found
# among this customer's orders. A demo script's run gets a shop world of its
# own holding exactly these (runs.services.demo_scripts).
DEMO_ORDERS: list[dict[str, Any]] = [
    {"order_id": "4821", "customer": DEMO_CUSTOMER_NAME,
     "item": "Copper kettle, 1.7 l", "amount": "89.00", "status": "delivered",
     "damaged": True, "delivered_days_ago": 2},
    {"order_id": "4790", "customer": DEMO_CUSTOMER_NAME,
     "item": "Linen tea towels, set of 3", "amount": "24.00",
     "status": "delivered", "damaged": False, "delivered_days_ago": 40},
]  # fmt: skip
MEMORY_PATH = "/memories/orders.md"
MEMORY_DATE = dt.date(2026, 10, 29)
MEMORY_TEXT = "chose replacement for order 4821"

_SORRY = "I'm sorry about the dented spout. "
# What the support agent answers when the replacement was not shipped, by the
# words of the reason: a reviewer's "ask the customer for a photo first", the
# resume re-check finding the order refunded, a crash leaving it unknown.
_NOT_SHIPPED: dict[str, Any] = {
    "text": _SORRY + "I could not ship a replacement for order 4821 "
    "({{call_replace.message}}), so nothing has been sent. Reply here if you "
    "would like a refund instead.",
    "usage": {"input_tokens": 640, "output_tokens": 48},
    "if_message": {
        "photo": {
            "text": _SORRY + "Before we send a replacement for order 4821, could "
            "you send us a photo of the damage? Reply to this message with the "
            "photo attached and we will take it from there.",
            "usage": {"input_tokens": 640, "output_tokens": 46},
        },
        "refunded": {
            "text": _SORRY + "Order 4821 has already been refunded in full, so "
            "we cannot also send a replacement. The refund reaches your card "
            "within a few days.",
            "usage": {"input_tokens": 640, "output_tokens": 40},
        },
        "unknown": {
            "text": _SORRY + "I asked for a replacement for order 4821, but I "
            "cannot confirm that it went through, so I will not ask again. A "
            "teammate checks the shipment and writes to you today.",
            "usage": {"input_tokens": 640, "output_tokens": 44},
        },
    },
}
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
        # Denied, blocked or unknown: say so, and promise nothing.
        "on_error": {"call_replace": _NOT_SHIPPED},
    },
    {
        "text": "I'm sorry about the dented spout. A replacement kettle is on its "
        "way and will arrive on {{call_date.delivery_date}}.",
        "usage": {"input_tokens": 720, "output_tokens": 60},
    },
]  # fmt: skip
INJECTION_REFUSAL = (
    "I can't help with that request. A teammate will review this conversation "
    "and follow up."
)
DEMO_GUARDRAILS = [
    {"name": "injection", "stage": "input", "rule": "prompt_injection",
     "refusal": INJECTION_REFUSAL},
]  # fmt: skip

# Script 7: the model sends "#4821", reads the schema's actionable error and
# corrects itself.
SCHEMA_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"id": "lookup_hash", "name": "lookup_order",
                     "arguments": {"order_id": "#4821"}}],
     "usage": {"input_tokens": 400, "output_tokens": 20}},
    {"text": "The order number goes without '#'.",
     "tool_calls": [{"id": "lookup_fixed", "name": "lookup_order",
                     "arguments": {"order_id": "4821"}}],
     "usage": {"input_tokens": 480, "output_tokens": 28}},
    {"text": "I found order 4821: the {{lookup_fixed.item}}, "
             "{{lookup_fixed.status}}. I'm sorry it arrived damaged. Would you "
             "like a replacement or a refund?",
     "usage": {"input_tokens": 560, "output_tokens": 40}},
]  # fmt: skip
# Script 8: an order number that does not exist; the tool's error names the
# customer's most recent order, and the model asks before acting.
NOT_FOUND_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"id": "lookup", "name": "lookup_order",
                     "arguments": {"order_id": "4812"}}],
     "usage": {"input_tokens": 400, "output_tokens": 20}},
    {"text": "I'm sorry, I couldn't find an order 4812. Your most recent order "
             "is {{lookup.suggested_order_id}} (the {{lookup.suggested_item}}, "
             "delivered {{lookup.suggested_delivery_date}}). Is that the one "
             "that arrived damaged? Please confirm and I'll take it from there.",
     "usage": {"input_tokens": 500, "output_tokens": 52}},
]  # fmt: skip
# Script 9: a week later; the memory of the first conversation is read.
FOLLOW_UP_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"id": "recall", "name": "memory",
                     "arguments": {"command": "view", "path": MEMORY_PATH}}],
     "usage": {"input_tokens": 420, "output_tokens": 22}},
    {"tool_calls": [{"id": "lookup", "name": "lookup_order",
                     "arguments": {"order_id": "4821"}}],
     "usage": {"input_tokens": 520, "output_tokens": 20}},
    {"text": "I'm sorry the new kettle leaks too. My notes from last time say: "
             "{{recall.entries}}. Shall I send another replacement for order "
             "{{lookup.order_id}} the same way? Say yes and I'll ask for it.",
     "usage": {"input_tokens": 640, "output_tokens": 50}},
]  # fmt: skip
# Script 10: a model that keeps checking and never answers. Alternating calls
# are not "no progress" (the same call and result over and over): the turn
# budget is what stops it.
LOOP_TURNS = 10
LOOP_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"id": f"check_{n}",
                     "name": "lookup_order" if n % 2 else "get_delivery_date",
                     "arguments": {"order_id": "4821"}}],
     "text": "Let me check that once more.",
     "usage": {"input_tokens": 400 + 40 * n, "output_tokens": 20}}
    for n in range(LOOP_TURNS + 2)
]  # fmt: skip
ESCALATION_HOOK = {"type": "escalate", "event": "run_finished", "name": "escalate"}

DEMO_EVAL_SUITE = "kettlecraft-task-07"
# Spec §2.1 ch. 9: task_07, judged here with rules only (no judge model), so it
# runs anywhere; the `kettlecraft` suite judges the rubric with a model.
DEMO_EVAL_DOCUMENT: dict[str, Any] = {
    "slug": DEMO_EVAL_SUITE,
    "name": "task_07: damaged kettle",
    "description": "The seed's task_07 (order #4821), graded without a judge "
    "model: demo script 11 runs it k=5 times.",
    "agent": DEMO_AGENT_SLUG,
    "cases": [
        {
            "slug": "task-07",
            "input": DEMO_INPUT,
            "world": {"orders": DEMO_ORDERS},
            "approvals": [{"tool": "create_replacement", "decision": "approve"}],
            "graders": [
                {"kind": "must_call", "tool": "get_delivery_date",
                 "args": {"order_id": "4821"}},
                {"kind": "must_call", "tool": "create_replacement",
                 "args": {"order_id": "4821"}, "status": "succeeded"},
                {"kind": "world_state", "object": "replacements",
                 "order_id": "4821", "count": 1},
                {"kind": "final_answer_regex", "pattern": "sorry|apolog",
                 "ignore_case": True},
                {"kind": "final_answer_regex",
                 "pattern": "arrive on [0-9]{4}-[0-9]{2}-[0-9]{2}"},
                {"kind": "final_answer_regex", "pattern": "[a-z]+_[a-z_]+",
                 "absent": True},
            ],
        }
    ],
}  # fmt: skip


def _agent_configs() -> dict[str, dict[str, Any]]:
    """Each demo agent's definition, by slug."""
    base: dict[str, Any] = {
        "endpoint": DEMO_ENDPOINT_SLUG,
        "model": "scripted-kettlecraft",
        "evaluated_models": ["scripted-kettlecraft"],
        "system_prompt": DEMO_SYSTEM_PROMPT,
        "tools": DEMO_TOOLS,
    }
    return {
        DEMO_AGENT_SLUG: {
            **base, "name": "Kettlecraft support",
            "evaluator": "kettlecraft_replacement", "script": DEMO_SCRIPT,
            "guardrails": DEMO_GUARDRAILS,
        },
        "kettlecraft-crash": {
            **base, "name": "Kettlecraft support (kill switch)",
            "script": DEMO_SCRIPT,
            "tool_settings": {"create_replacement": {"crash_after_effect": True}},
        },
        "kettlecraft-crash-no-keys": {
            **base, "name": "Kettlecraft support (kill switch, no key support)",
            "script": DEMO_SCRIPT,
            "tool_settings": {"create_replacement": {
                "crash_after_effect": True, "idempotency_keys": False}},
        },
        "kettlecraft-schema": {
            **base, "name": "Kettlecraft support (sends #4821)",
            "script": SCHEMA_SCRIPT,
        },
        "kettlecraft-not-found": {
            **base, "name": "Kettlecraft support (order not found)",
            "script": NOT_FOUND_SCRIPT,
        },
        "kettlecraft-follow-up": {
            **base, "name": "Kettlecraft support (with memory)",
            "tools": [*DEMO_TOOLS, "memory"], "script": FOLLOW_UP_SCRIPT,
        },
        "kettlecraft-looping": {
            **base, "name": "Kettlecraft support (loops)",
            "script": LOOP_SCRIPT, "default_limits": {"max_steps": LOOP_TURNS},
            "hooks": [ESCALATION_HOOK],
        },
    }  # fmt: skip


def _seed_agent(tenant: Tenant, slug: str, config: dict[str, Any]) -> None:
    agent = Agent.objects.filter(
        tenant=tenant, slug=slug, deleted_at__isnull=True
    ).first()
    if agent is None:
        agent_create(tenant=tenant, actor=None, slug=slug, config=config)
    else:  # a new version only if the demo's definition changed
        agent_update(agent=agent, actor=None, config=config, partial=False)


@transaction.atomic
def demo_seed_shop(*, tenant: Tenant) -> None:
    today = dt.date.today()
    for order in DEMO_ORDERS:
        ShopOrder.objects.get_or_create(
            tenant=tenant,
            world=None,
            order_id=order["order_id"],
            defaults={
                "customer": order["customer"],
                "item": order["item"],
                "amount": Decimal(order["amount"]),
                "status": order["status"],
                "damaged": order["damaged"],
                "delivery_date": today - dt.timedelta(days=order["delivered_days_ago"]),
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
    for slug, config in _agent_configs().items():
        _seed_agent(tenant, slug, config)
    # The first conversation's dated fact, for the follow-up (script 9); its
    # key makes seeding it again write nothing.
    memory_create(
        scope=memory_scope(tenant_id=tenant.id, end_user=DEMO_CUSTOMER),
        path=MEMORY_PATH,
        text=MEMORY_TEXT,
        key="demo-seed",
        today=MEMORY_DATE,
    )


@transaction.atomic
def demo_seed_eval_task_07(*, tenant: Tenant) -> None:
    """Demo script 11's suite, once (a person may edit it afterwards). A seeder
    of its own (settings.DEMO_SEEDERS), after the shop's."""
    if not EvalSuite.objects.filter(tenant=tenant, slug=DEMO_EVAL_SUITE).exists():
        eval_suite_create(tenant=tenant, actor=None, document=DEMO_EVAL_DOCUMENT)
