"""A team's own agent, instrumented by `opentelemetry-instrumentation-openai-v2`
(the real OpenAI SDK against a local Chat Completions server, a streamed call
that asks for a tool, then a plain one), sends its trace over OTLP/HTTP; its run
page says what a person needs: steps, tool calls, tokens, and per model call the
model that answered, why it stopped and what went in and out."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from controlplane.services import api_token_issue
from runs.devserver.chat_completions import ChatCompletionsServer
from runs.models import Run
from tests.tracing.test_ingest_instrumented import ANSWERED, SCRIPT, run_agent

pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def model() -> Iterator[ChatCompletionsServer]:
    with ChatCompletionsServer(script=SCRIPT, model=ANSWERED) as running:
        yield running  # type: ignore[misc]


def rows(page: Any, name: str) -> Any:
    return page.get_by_role("tree").get_by_role("treeitem", name=re.compile(name))


def fact(page: Any, scope: str, name: str) -> Any:
    """The value beside a term of a facts list."""
    return page.locator(f"{scope} dt", has_text=re.compile(f"^{name}$")).locator(
        "xpath=following-sibling::dd[1]"
    )


def test_the_run_page_of_an_instrumented_agent_shows_models_finish_and_counts(
    daphne: Any,
    open_page: Any,
    admin_user: Any,
    tenant: Any,
    model: ChatCompletionsServer,
) -> None:
    secret = api_token_issue(tenant=tenant, user=admin_user).secret
    trace_id = run_agent("openai-v2", model, daphne, secret, "--first-streams")
    run = Run.objects.get(tenant=tenant, trace_id=trace_id)

    page = open_page(admin_user, f"/runs/{run.id}/")
    expect(fact(page, "#run-facts", "Steps")).to_have_text("2")
    expect(fact(page, "#run-facts", "Tool calls")).to_have_text("1")
    expect(fact(page, "#run-facts", "Tokens")).to_have_text("108 in / 21 out")
    expect(fact(page, "#run-facts", "Answer")).to_contain_text("arrives tomorrow")

    chats = rows(page, r"^chat ")
    expect(chats).to_have_count(2)
    # The streamed call: it asked for the tool.
    chats.nth(0).click()
    expect(page.get_by_test_id("span-model")).to_have_text(ANSWERED)
    expect(fact(page, "#detail", "Finish")).to_have_text("tool_calls")
    expect(page.get_by_test_id("span-tokens")).to_have_text("41 in / 9 out")
    expect(page.get_by_test_id("span-input")).to_contain_text("Where is order 4821?")
    expect(page.get_by_test_id("span-output")).to_contain_text("lookup_order")
    asked = page.locator("#detail table.attrs tr", has_text="gen_ai.request.model")
    expect(asked).to_contain_text("gpt-4o-mini")
    # The plain call: it answered.
    chats.nth(1).click()
    expect(fact(page, "#detail", "Finish")).to_have_text("stop")
    expect(page.get_by_test_id("span-tokens")).to_have_text("67 in / 12 out")
    expect(page.get_by_test_id("span-output")).to_contain_text("arrives tomorrow")
    expect(page.get_by_test_id("span-input")).to_contain_text("shipped")

    rows(page, r"^execute_tool lookup_order").click()
    expect(page.get_by_test_id("span-result")).to_contain_text("shipped")
