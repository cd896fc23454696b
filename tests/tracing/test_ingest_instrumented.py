"""Real traces of a team's own agent, as the two instrumentation libraries send
them: the real OpenAI SDK against a local Chat Completions server, patched by
`openinference-instrumentation-openai` or `opentelemetry-instrumentation-openai-v2`,
exported by the official OTLP/HTTP exporters (spans, and openai-v2's log events)
to a live Daphne. What the API then shows: the run of the trace, its steps, tool
calls and tokens, and each model call's request and response models, finish
reason and messages."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.contrib.auth import get_user_model

from controlplane.services import api_token_issue, membership_set, tenant_create
from runs.devserver.chat_completions import ChatCompletionsServer
from tests.conftest import BASE_DIR
from tests.frontend.conftest import DaphneServer

REQUESTED = "gpt-4o-mini"
ANSWERED = "gpt-4o-mini-2024-07-18"  # what the provider reports it ran
SCRIPT: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {"name": "lookup_order", "arguments": {"order": "4821"}, "id": "call_7"}
        ],
        "usage": {"input_tokens": 41, "output_tokens": 9},
    },
    {
        "text": "Order 4821 has shipped and arrives tomorrow.",
        "usage": {"input_tokens": 67, "output_tokens": 12},
    },
]


@pytest.fixture(scope="module")
def server(django_db_setup: Any, tmp_path_factory: Any) -> Iterator[DaphneServer]:
    daphne = DaphneServer(Path(tmp_path_factory.mktemp("instrumented"))).start()
    yield daphne
    daphne.stop()


@pytest.fixture(scope="module")
def model() -> Iterator[ChatCompletionsServer]:
    with ChatCompletionsServer(script=SCRIPT, model=ANSWERED) as running:
        yield running  # type: ignore[misc]


@pytest.fixture
def secret(transactional_db: Any, admin_user: Any, tenant: Any) -> str:
    return api_token_issue(tenant=tenant, user=admin_user).secret


def run_agent(
    library: str,
    model: ChatCompletionsServer,
    server: DaphneServer,
    secret: str,
    *flags: str,
) -> str:
    """The agent in its own process; its trace id."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.tracing.instrumented_agent", library,
         model.base_url, server.url, secret, *flags],
        cwd=BASE_DIR, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def get(server: DaphneServer, secret: str, path: str) -> Any:
    response = requests.get(
        f"{server.url}{path}", headers={"Authorization": f"Bearer {secret}"}, timeout=30
    )
    assert response.status_code == 200, response.text
    return response.json()


def spans_of(server: DaphneServer, secret: str, run_id: str) -> list[dict[str, Any]]:
    """Every span of the run, each with its payloads (the span detail API)."""
    found: list[dict[str, Any]] = []
    parents = [""]
    while parents:
        parent = parents.pop()
        page = get(server, secret, f"/api/v1/runs/{run_id}/spans/?parent={parent}")
        for span in page["results"]:
            found.append(get(server, secret, f"/api/v1/spans/{span['id']}/"))
            parents.append(span["span_id"])
    return found


@pytest.mark.parametrize(
    ("library", "flags"),
    [
        ("openinference", []),
        ("openinference", ["--first-streams"]),
        ("openai-v2", []),
        ("openai-v2", ["--first-streams"]),
    ],
)
def test_an_instrumented_agents_trace_shows_models_finish_reasons_and_counts(
    library: str,
    flags: list[str],
    server: DaphneServer,
    model: ChatCompletionsServer,
    secret: str,
) -> None:
    trace_id = run_agent(library, model, server, secret, *flags)

    listed = get(server, secret, f"/api/v1/runs/?trace_id={trace_id}")
    assert listed["count"] == 1
    run = get(server, secret, f"/api/v1/traces/{trace_id.upper()}/")
    assert run["id"] == listed["results"][0]["id"]
    assert run["trace_id"] == trace_id
    assert run["agent"] == f"external-{library}-support"
    assert run["stop_reason"] == "external" and run["status"] == "succeeded"
    # Two model calls, one tool call; the tokens the provider reported.
    assert (run["steps"], run["tool_calls"]) == (2, 1)
    assert (run["input_tokens"], run["output_tokens"]) == (41 + 67, 9 + 12)
    assert "Where is order 4821?" in run["input"]
    assert "arrives tomorrow" in run["final_answer"]

    spans = spans_of(server, secret, run["id"])
    chats = sorted(
        (s for s in spans if s["attributes"].get("gen_ai.operation.name") == "chat"),
        key=lambda s: s["started_at"],
    )
    assert len(chats) == 2
    for chat in chats:
        attributes = chat["attributes"]
        assert attributes["gen_ai.request.model"] == REQUESTED
        assert attributes["gen_ai.response.model"] == ANSWERED
        assert attributes["gen_ai.provider.name"] == "openai"
    first, second = chats
    assert first["attributes"]["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert second["attributes"]["gen_ai.response.finish_reasons"] == ["stop"]
    assert (
        first["attributes"]["gen_ai.usage.input_tokens"],
        first["attributes"]["gen_ai.usage.output_tokens"],
    ) == (41, 9)
    asked = first["payload_bodies"]["gen_ai.input.messages"]
    assert asked[0]["role"] == "user"
    assert asked[0]["parts"] == [{"type": "text", "content": "Where is order 4821?"}]
    called = first["payload_bodies"]["gen_ai.output.messages"][0]
    assert called["finish_reason"] == "tool_calls"
    call = next(p for p in called["parts"] if p["type"] == "tool_call")
    assert (call["id"], call["name"], call["arguments"]) == (
        "call_7",
        "lookup_order",
        {"order": "4821"},
    )
    answered = second["payload_bodies"]["gen_ai.output.messages"][0]
    assert answered["finish_reason"] == "stop"
    assert "arrives tomorrow" in str(answered["parts"])
    # The tool's result went back to the model.
    assert "shipped" in str(second["payload_bodies"]["gen_ai.input.messages"])

    tools = [
        s
        for s in spans
        if s["attributes"].get("gen_ai.operation.name") == "execute_tool"
    ]
    assert [t["attributes"]["gen_ai.tool.name"] for t in tools] == ["lookup_order"]
    assert "shipped" in str(tools[0]["payload_bodies"]["gen_ai.tool.call.result"])


@pytest.mark.parametrize("flags", [[], ["--first-streams"]])
def test_openai_v2_message_content_sent_as_log_events_joins_its_spans(
    flags: list[str],
    server: DaphneServer,
    model: ChatCompletionsServer,
    secret: str,
) -> None:
    """openai-v2's default: content as log events to /v1/logs, not on the span."""
    trace_id = run_agent("openai-v2", model, server, secret, "--logs", *flags)
    run = get(server, secret, f"/api/v1/traces/{trace_id}/")
    assert (run["steps"], run["tool_calls"]) == (2, 1)
    assert (run["input_tokens"], run["output_tokens"]) == (108, 21)
    spans = spans_of(server, secret, run["id"])
    chats = sorted(
        (s for s in spans if s["attributes"].get("gen_ai.operation.name") == "chat"),
        key=lambda s: s["started_at"],
    )
    assert [c["attributes"]["gen_ai.response.model"] for c in chats] == [ANSWERED] * 2
    assert [c["attributes"]["gen_ai.request.model"] for c in chats] == [REQUESTED] * 2
    # The streamed call's span names no finish reason: its gen_ai.choice event does.
    assert [c["attributes"]["gen_ai.response.finish_reasons"] for c in chats] == [
        ["tool_calls"],
        ["stop"],
    ]
    first, second = (c["payload_bodies"] for c in chats)
    assert "Where is order 4821?" in str(first["gen_ai.input.messages"])
    called = first["gen_ai.output.messages"][0]
    assert called["finish_reason"] == "tool_calls"
    assert "lookup_order" in str(called) and "call_7" in str(called)
    assert "shipped" in str(second["gen_ai.input.messages"])
    assert "arrives tomorrow" in str(second["gen_ai.output.messages"])


def test_a_resent_trace_counts_once_and_other_tenants_cannot_find_it(
    server: DaphneServer, model: ChatCompletionsServer, secret: str, tenant: Any
) -> None:
    trace_id = run_agent("openinference", model, server, secret, "--resend")
    run = get(server, secret, f"/api/v1/traces/{trace_id}/")
    assert (run["steps"], run["tool_calls"]) == (2, 1)
    assert (run["input_tokens"], run["output_tokens"]) == (108, 21)
    assert len(spans_of(server, secret, run["id"])) == 4

    rival = tenant_create(slug="rival", name="Rival")
    stranger = get_user_model().objects.create_user(username="rival-admin")
    membership_set(tenant=rival, user=stranger, role="admin")
    theirs = api_token_issue(tenant=rival, user=stranger).secret
    headers = {"Authorization": f"Bearer {theirs}"}
    missing = requests.get(
        f"{server.url}/api/v1/traces/{trace_id}/", headers=headers, timeout=30
    )
    assert missing.status_code == 404
    assert "4821" not in missing.text
    listed = requests.get(
        f"{server.url}/api/v1/runs/?trace_id={trace_id}", headers=headers, timeout=30
    ).json()
    assert listed["count"] == 0


def test_a_trace_id_that_is_not_32_hex_digits_is_400_naming_it(
    server: DaphneServer, secret: str
) -> None:
    headers = {"Authorization": f"Bearer {secret}"}
    for path in ("/api/v1/traces/not-a-trace/", "/api/v1/runs/?trace_id=abc"):
        response = requests.get(f"{server.url}{path}", headers=headers, timeout=30)
        assert response.status_code == 400, path
        assert "trace_id" in response.json()["error"]["fields"], path
