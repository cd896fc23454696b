"""A question to a person, in real Chromium against Daphne, Redis and a Celery
worker: the agent's `ask_human` question appears live in the inbox, marked
"Question"; a person answers it there; the run page then shows the agent's
final answer quoting it, and the call's span shows who answered what."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import Question
from runs.models import Run
from runs.services import run_start
from tests.agents import make_agent
from tests.conftest import wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.worker,
    pytest.mark.usefixtures("runs_settle_before_flush"),
]

ADDRESS = "12 Elm Street, Leeds"
SCRIPT = [
    {
        "text": "I need the delivery address.",
        "tool_calls": [
            {
                "id": "call_ask",
                "name": "ask_human",
                "arguments": {"question": "Where should the replacement go?"},
            }
        ],
    },
    {"text": "Shipping the replacement to {{call_ask.answer}}."},
]
CHOICE_SCRIPT = [
    {
        "tool_calls": [
            {
                "id": "call_pick",
                "name": "ask_human",
                "arguments": {
                    "question": "Refund or replace?",
                    "choices": ["refund", "replace"],
                },
            }
        ]
    },
    {"text": "You chose {{call_pick.answer}}."},
]


def test_a_person_answers_a_question_from_the_inbox_and_reads_the_answer(
    tenant: Any, operator_user: Any, open_page: Any, ui_worker: Any
) -> None:
    page = open_page(operator_user, "/approvals/")
    expect(page.locator("#questions-empty")).to_be_visible()
    agent = make_agent(tenant, "asker", tools=["ask_human"], script=SCRIPT)
    run = run_start(
        tenant=tenant, agent_slug=agent.slug, input="Order 4821 is damaged",
        started_by=operator_user,
    )  # fmt: skip
    # Live: the card comes through the tenant stream, no reload.
    card = page.locator("#questions li.question")
    # (A first step of a fresh worker may take a while.)
    expect(card).to_have_count(1, timeout=30_000)
    expect(card.locator(".status")).to_have_text(re.compile("Question"))
    expect(card.get_by_test_id("question-text")).to_have_text(
        "Where should the replacement go?"
    )
    expect(card.locator(".agent-name")).to_have_text("asker")
    assert Run.objects.get(id=run.id).status == Run.Status.WAITING_INPUT
    card.get_by_label("Your answer").fill(ADDRESS)
    card.get_by_role("button", name="Send answer").click()
    expect(page.locator("#questions-error")).to_contain_text(f"Answered “{ADDRESS}”")
    expect(card).to_have_count(0)
    question = Question.objects.get(run=run)
    assert (question.status, question.answer) == ("answered", ADDRESS)
    assert question.answered_by == operator_user

    wait_for(
        lambda: Run.objects.get(id=run.id).status in Run.TERMINAL, what="run ended"
    )
    page.goto(f"/runs/{run.id}/")
    expect(page.locator("#run-facts")).to_contain_text(
        f"Shipping the replacement to {ADDRESS}."
    )
    page.get_by_role("treeitem", name=re.compile("execute_tool ask_human")).click()
    box = page.get_by_test_id("span-question")
    expect(box.get_by_test_id("question-text")).to_have_text(
        "Where should the replacement go?"
    )
    expect(box.get_by_test_id("question-answer")).to_have_text(
        f"Answered by {operator_user.username}: {ADDRESS}"
    )


def test_a_question_with_choices_is_answered_with_a_button(
    tenant: Any, operator_user: Any, viewer_user: Any, open_page: Any, ui_worker: Any
) -> None:
    agent = make_agent(tenant, "picker", tools=["ask_human"], script=CHOICE_SCRIPT)
    run = run_start(
        tenant=tenant, agent_slug=agent.slug, input="Order 4821 is damaged",
        started_by=operator_user,
    )  # fmt: skip
    wait_for(lambda: Question.objects.filter(run=run).exists(), what="the question")
    # A viewer reads the question but has nothing to answer with.
    watcher = open_page(viewer_user, "/approvals/")
    seen = watcher.locator("#questions li.question")
    expect(seen.get_by_test_id("question-text")).to_have_text("Refund or replace?")
    expect(seen.get_by_role("button")).to_have_count(0)
    page = open_page(operator_user, "/approvals/")
    card = page.locator("#questions li.question")
    expect(card.get_by_role("button")).to_have_text(["refund", "replace"])
    card.get_by_role("button", name="Answer replace").click()
    expect(card).to_have_count(0)
    wait_for(
        lambda: Run.objects.get(id=run.id).status in Run.TERMINAL, what="run ended"
    )
    assert Run.objects.get(id=run.id).final_answer == "You chose replace."
