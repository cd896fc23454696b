"""The run page shows a streamed reply's text while the model writes, in real
Chromium against Daphne and Redis, and lets it go once the chat span has ended
with the whole output."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import pytest
from django.db import connection
from playwright.sync_api import expect

from runs.devserver import Behaviour, ChatCompletionsServer, Reply
from runs.engine.adapters.openai_compatible import OpenAIModel
from runs.engine.budget import BudgetVector
from runs.engine.step import ModelCallPlan, call_model
from runs.models import Run
from runs.services import run_start
from runs.spans import chat_span
from tests.frontend.test_browser import shop

__all__ = ["shop"]

pytestmark = [pytest.mark.browser]

TEXT = " ".join(f"word{i}" for i in range(60))
MESSAGES = [{"role": "user", "content": "Tell me a long story."}]


def stream_reply(run: Run, server: ChatCompletionsServer) -> None:
    """The model phase as a step runs it: a streamed call inside its chat span."""
    adapter = OpenAIModel(
        model="gpt-live", api_key="k", base_url=server.base_url, stream=True
    )
    try:
        with chat_span(run, messages_json=json.dumps(MESSAGES), tools=[]) as chat:
            reply = call_model(
                adapter, MESSAGES, [], ModelCallPlan(512, 10, BudgetVector()),
                on_delta=chat.deltas(),
            )  # fmt: skip
            chat.reply(reply)
    finally:
        connection.close()


def test_the_reply_streams_into_the_page_and_leaves_when_the_span_ends(
    shop: Any, operator_user: Any, open_page: Any
) -> None:
    run = run_start(
        tenant=shop, agent_slug="kettlecraft-support", input="hi", started_by=None
    )
    page = open_page(operator_user, f"/runs/{run.id}/")
    expect(page.locator("body[data-stream='live']")).to_have_count(1)
    live = page.get_by_test_id("live-output")
    with ChatCompletionsServer() as server:
        # 60 words in ~90 pieces 50 ms apart: about four seconds of writing.
        server.push(Behaviour(reply=Reply(text=TEXT), chunk_delay=0.05))
        writer = threading.Thread(target=stream_reply, args=(run, server))
        writer.start()
        expect(live).to_contain_text("word5", timeout=10_000)
        partial = live.inner_text()
        assert partial.startswith("word0 word1") and not partial.endswith("word59")
        expect(live).to_contain_text("word59", timeout=15_000)
        writer.join(15)
    # The span ended: its whole output is in the trace, the live box is gone.
    expect(page.locator("#live-output")).to_be_hidden(timeout=10_000)
    page.get_by_role("tree").get_by_role("treeitem", name=re.compile(r"^chat ")).click()
    expect(page.get_by_test_id("span-output")).to_contain_text("word59")
