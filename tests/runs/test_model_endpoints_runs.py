"""Runs of agents on real model endpoints (local servers speaking each protocol):
streaming by default, the fallback answering when the primary fails, the
answering model's price, a circuit that fails fast, and what the chat span says."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from budgets.models import ModelPriceEntry
from runs.breaker import breaker_store
from runs.devserver import ChatCompletionsServer, MessagesServer
from runs.models import Run, Step
from runs.services import run_start
from runs.services.agent_validation import DefinitionError
from runs.services.agents import model_endpoint_create
from tests.agents import endpoint_for, make_agent
from tracing.models import Span

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def servers() -> Iterator[tuple[ChatCompletionsServer, MessagesServer]]:
    with ChatCompletionsServer() as primary, MessagesServer() as backup:
        assert isinstance(primary, ChatCompletionsServer)
        assert isinstance(backup, MessagesServer)
        yield primary, backup


@pytest.fixture(autouse=True)
def breakers_closed() -> Iterator[None]:
    yield
    client = breaker_store().client
    for key in client.scan_iter(match="cp:breaker:*"):
        client.delete(key)


def agent_with_fallback(tenant: Any, primary: str, backup: str, **kw: Any) -> Any:
    fallback = model_endpoint_create(
        tenant=tenant,
        actor=None,
        data={
            "slug": f"backup-{uuid.uuid4().hex[:6]}",
            "name": "Backup",
            "kind": "anthropic",
            "base_url": backup,
            "options": {"max_retries": 0},
        },
    )
    return make_agent(
        tenant,
        f"agent-{uuid.uuid4().hex[:6]}",
        kind="openai",
        model="gpt-main",
        base_url=primary,
        options={"max_retries": 0, "breaker_failures": 2},
        fallback_endpoint=fallback.slug,
        fallback_model="claude-backup",
        evaluated_models=["gpt-main", "claude-backup"],
        **kw,
    )


def start(agent: Any) -> Run:
    return run_start(
        tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
    )


def test_an_openai_endpoint_streams_by_default_and_the_run_keeps_the_whole_answer(
    tenant: Any, drive_run: Any, servers: Any
) -> None:
    primary, _ = servers
    primary.reply("Order 4821 ships Thursday.", input_tokens=50, output_tokens=8)
    agent = make_agent(tenant, "streamer", kind="openai", model="gpt-main",
                       base_url=primary.base_url)  # fmt: skip
    run = drive_run(start(agent))
    assert run.final_answer == "Order 4821 ships Thursday."
    body = primary.requests[0]["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    step = Step.objects.get(run=run, index=0)
    assert step.reply["raw"]["streamed"] is True
    assert (step.input_tokens, step.output_tokens) == (50, 8)
    chat = Span.objects.get(run=run, name__startswith="chat")
    assert chat.attributes["cp.model.endpoint"] == "openai"
    assert chat.attributes["cp.model.circuit"] == "closed"
    assert chat.attributes["cp.model.fallback_used"] is False


def test_the_fallback_answers_priced_as_itself_then_the_circuit_opens(
    tenant: Any, drive_run: Any, servers: Any
) -> None:
    primary, backup = servers
    ModelPriceEntry.objects.create(
        model="claude-backup", input_per_million=Decimal("1000"),
        cached_input_per_million=Decimal("0"), output_per_million=Decimal("2000"),
    )  # fmt: skip
    agent = agent_with_fallback(tenant, primary.base_url, backup.base_url)
    for n in range(2):
        primary.error(503, "the primary is down")
        backup.reply(f"backup answer {n}", input_tokens=100, output_tokens=10)
        run = drive_run(start(agent))
        assert run.final_answer == f"backup answer {n}"
        step = Step.objects.get(run=run, index=0)
        assert (step.provider, step.model) == ("anthropic", "claude-backup")
        # 100 input at $1000/M + 10 output at $2000/M
        assert step.cost == Decimal("0.12")
        chat = Span.objects.get(run=run, name__startswith="chat")
        assert chat.attributes["cp.model.fallback_used"] is True
        assert chat.attributes["cp.model.fallback_reason"] == "server"
        assert chat.attributes["cp.model.answered_by.model"] == "claude-backup"
        assert "model.fallback" in [e["name"] for e in chat.events]
    assert "model.circuit_opened" in [e["name"] for e in chat.events]
    # Open: the next run goes straight to the backup.
    backup.reply("while the circuit is open")
    run = drive_run(start(agent))
    assert run.final_answer == "while the circuit is open"
    assert len(primary.requests) == 2
    chat = Span.objects.get(run=run, name__startswith="chat")
    assert chat.attributes["cp.model.circuit"] == "open"
    assert chat.attributes["cp.model.fallback_reason"] == "circuit_open"


def test_with_no_fallback_an_open_circuit_fails_the_run_fast(
    tenant: Any, drive_run: Any, servers: Any
) -> None:
    primary, _ = servers
    agent = make_agent(
        tenant, "no-backup", kind="openai", model="gpt-main", base_url=primary.base_url,
        options={"max_retries": 0, "breaker_failures": 2},
    )  # fmt: skip
    for _ in range(2):
        primary.error(500, "boom")
        run = drive_run(start(agent))
        assert run.status == Run.Status.FAILED and run.stop_reason == "model_error"
    run = drive_run(start(agent))
    assert run.status == Run.Status.FAILED and run.stop_reason == "model_error"
    assert "circuit_open" in run.stop_detail and "'openai'" in run.stop_detail
    assert len(primary.requests) == 2  # not asked again
    chat = Span.objects.get(run=run, name__startswith="chat")
    assert chat.attributes["error.type"] == "circuit_open"
    assert chat.attributes["cp.model.circuit"] == "open"


def test_a_fallback_of_unknown_price_is_not_used_under_a_cost_cap(
    tenant: Any, drive_run: Any, servers: Any
) -> None:
    primary, backup = servers
    ModelPriceEntry.objects.create(
        model="gpt-main", input_per_million=Decimal("1"),
        cached_input_per_million=Decimal("0"), output_per_million=Decimal("1"),
    )  # fmt: skip
    agent = agent_with_fallback(
        tenant, primary.base_url, backup.base_url, default_limits={"max_cost": "5"}
    )
    primary.error(503, "down")
    run = drive_run(start(agent))
    assert run.status == Run.Status.FAILED and run.stop_reason == "model_error"
    assert backup.requests == []


def test_an_endpoint_option_outside_its_range_is_refused_naming_it(tenant: Any) -> None:
    with pytest.raises(DefinitionError) as caught:
        endpoint_for(tenant, kind="openai", base_url="http://127.0.0.1:9/v1",
                     options={"breaker_failures": 0})  # fmt: skip
    assert "breaker_failures" in str(caught.value.fields["options"])
