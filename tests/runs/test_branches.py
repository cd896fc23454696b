"""Retry and fork through a real Celery worker on the scripted model: a retried
run keeps the tool results it had (the tool does not run again) and the model
sees them; a fork with an edited tool result makes the model see exactly the
edit while the original branch stays as it was; refused requests write
nothing (issue 28 item 5, docs/engine.md "Branches")."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from approvals.models import ApprovalRequest
from runs.branch_selectors import run_branches_for
from runs.engine.loop import EngineState
from runs.engine.session import SessionEntry as Entry
from runs.engine.session import build_context
from runs.models import Run, SessionBranch, SessionEntry, ToolCall
from runs.services import run_cancel, run_start
from runs.services.branches import run_fork, run_retry
from runs.services.decide import approval_decide
from runs.services.retention import run_delete
from shop.models import Replacement
from tests.conftest import wait_for
from tracing.models import Span
from tracing.selectors import run_spans_with_payloads

pytestmark = [pytest.mark.django_db(transaction=True)]

REPLACE = {
    "text": "Shipping a replacement.",
    "tool_calls": [
        {
            "id": "call_replace",
            "name": "create_replacement",
            "arguments": {"order_id": "4821", "reason": "it arrived damaged"},
        }
    ],
}
PROVIDER_DOWN = {"error": {"kind": "server_error", "message": "upstream said 503"}}
SHIPPED = {"text": "A replacement arrives on {{call_replace.delivery_date}}."}
LOOKUP = {
    "text": "Let me look the order up.",
    "tool_calls": [
        {"id": "call_lookup", "name": "lookup_order", "arguments": {"order_id": "4821"}}
    ],
}
GREET = {"text": "The order is {{call_lookup.customer}}'s."}
CUSTOMER = "Ada Whitfield (c-8812)"  # the demo order's, as lookup_order returns it


def settled(run: Run, timeout: float = 90) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.status in Run.TERMINAL:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run.id} still {run.status}")


def chat_inputs(run: Run) -> list[list[dict[str, Any]]]:
    """Each model call's exact input messages, in order."""
    wait_for(
        lambda: (
            Span.objects.filter(run=run).exists()
            and not Span.objects.filter(run=run, ended_at__isnull=True).exists()
        ),
        what="every span of the run ended",
    )
    calls = []
    for span, bodies in run_spans_with_payloads(tenant=run.tenant, run_id=run.id):
        if span.attributes.get("gen_ai.operation.name") == "chat":
            found = {**span.attributes, **bodies}
            calls.append(json.loads(found["gen_ai.input.messages"]))
    return calls


def entries_of(run: Run) -> list[tuple[int, str, str, str, Any]]:
    rows = SessionEntry.objects.filter(run=run).order_by("seq")
    return [(r.seq, r.entry_id, r.parent_id, r.type, r.payload) for r in rows]


def rebuilt(run: Run) -> list[dict[str, Any]]:
    """The run's context rebuilt from its leaf over the whole session tree."""
    rows = SessionEntry.objects.all()
    log = {
        r.entry_id: Entry(r.seq, r.entry_id, r.parent_id or None, r.type, r.payload)
        for r in rows
    }
    return build_context(log, run.engine_state["session"]["leaf"])


@pytest.mark.worker
def test_a_retry_keeps_the_tool_result_and_does_not_run_the_tool_again(
    shop, scripted_agent, operator_user, api_client_for, celery_worker_process
):
    agent = scripted_agent(
        [REPLACE, PROVIDER_DOWN, SHIPPED],
        ["lookup_order", "create_replacement"],
        evaluator="kettlecraft_replacement",
        tool_settings={"create_replacement": {"approval": "never"}},
    )
    original = settled(
        run_start(
            tenant=shop,
            agent_slug=agent.slug,
            input="order 4821 broke",
            started_by=operator_user,
        )  # fmt: skip
    )
    assert (original.status, original.stop_reason) == ("failed", "model_error")
    assert Replacement.objects.count() == 1
    assert list(ToolCall.objects.values_list("run_id", "tool_name", "status")) == [
        (original.id, "create_replacement", "succeeded")
    ]
    before = entries_of(original)
    failed_call_saw = chat_inputs(original)[1]

    client = api_client_for(operator_user, shop)
    response = client.post(f"/api/v1/runs/{original.id}/retry/")
    assert response.status_code == 201, response.content
    retry = settled(Run.objects.get(id=response.json()["id"]))

    assert retry.status == "succeeded", retry.stop_detail
    assert "A replacement arrives on" in retry.final_answer
    # Nothing ran twice: one replacement in the world, one call row in all.
    assert Replacement.objects.count() == 1
    assert ToolCall.objects.count() == 1
    assert not ToolCall.objects.filter(run=retry).exists()
    # The retry's one model call saw what the failed call was sent: the
    # earlier tool result included.
    (retry_saw,) = chat_inputs(retry)
    assert retry_saw == failed_call_saw
    assert retry_saw[-1]["role"] == "tool"
    assert retry_saw[-1]["tool_call_id"] == "call_replace"
    assert json.loads(retry_saw[-1]["content"])["ok"] is True
    # One tree: the retry's first entry hangs off the original's last one.
    assert entries_of(original) == before
    first = SessionEntry.objects.filter(run=retry).order_by("seq").first()
    assert first is not None and first.type == "custom"
    assert first.parent_id == before[-1][1]
    assert first.payload == {
        "kind": "branch",
        "run": str(original.id),
        "from": before[-1][1],
        "reason": "retry",
    }
    assert rebuilt(retry) == retry.engine_state["messages"]
    branches = client.get(f"/api/v1/runs/{retry.id}/branches/").json()
    assert [(b["kind"], b["status"], b["current"]) for b in branches] == [
        ("root", "failed", False),
        ("retry", "succeeded", True),
    ]
    assert branches[1]["branch_of"] == str(original.id)
    assert branches[1]["from_entry"] == before[-1][1]
    # The session API of either run shows the whole tree.
    session = client.get(f"/api/v1/runs/{original.id}/session/").json()
    assert {e["run"] for e in session["entries"]} == {str(original.id), str(retry.id)}
    assert session["messages"] == original.engine_state["messages"]


@pytest.mark.worker
def test_a_fork_with_an_edited_tool_result_shows_the_model_the_edit(
    shop, scripted_agent, operator_user, api_client_for, celery_worker_process
):
    agent = scripted_agent([LOOKUP, GREET], ["lookup_order"])
    original = settled(
        run_start(
            tenant=shop,
            agent_slug=agent.slug,
            input="whose is 4821?",
            started_by=operator_user,
        )  # fmt: skip
    )
    assert original.status == "unverified"
    assert original.final_answer == f"The order is {CUSTOMER}'s."
    before = entries_of(original)
    original_calls = chat_inputs(original)
    edited = {"ok": True, "data": {"order_id": "4821", "customer": "Grace Hopper"}}

    client = api_client_for(operator_user, shop)
    response = client.post(
        f"/api/v1/runs/{original.id}/fork/",
        {"from_step": 0, "tool_result": edited},
        format="json",
    )
    assert response.status_code == 201, response.content
    fork = settled(Run.objects.get(id=response.json()["id"]))

    assert fork.status == "unverified"
    assert fork.final_answer == "The order is Grace Hopper's."
    # Exactly what the original's second call saw, with the result edited.
    expected = [dict(m) for m in original_calls[1]]
    assert expected[-1]["tool_call_id"] == "call_lookup"
    expected[-1] = {**expected[-1], "content": json.dumps(edited)}
    assert chat_inputs(fork) == [expected]
    # The tool did not run on the fork; the original is as it was.
    assert ToolCall.objects.count() == 1
    assert entries_of(original) == before
    assert rebuilt(original) == original.engine_state["messages"]
    assert "Ada Whitfield" in original.engine_state["messages"][-2]["content"]
    marker, edit = list(SessionEntry.objects.filter(run=fork).order_by("seq"))[:2]
    assert (marker.type, edit.type) == ("custom", "context_edit")
    lookup_result = next(
        e for e in before if e[3] == "message" and e[4]["message"]["role"] == "tool"
    )
    assert marker.parent_id == lookup_result[1]
    assert edit.payload["target"] == lookup_result[1]
    # The fork's session API rebuilds the edited context; ?leaf= on the
    # original's last entry still shows the original.
    session = client.get(f"/api/v1/runs/{fork.id}/session/").json()
    assert session["messages"] == fork.engine_state["messages"]
    as_was = client.get(f"/api/v1/runs/{fork.id}/session/?leaf={before[-1][1]}")
    assert as_was.json()["messages"] == original.engine_state["messages"]
    branch = SessionBranch.objects.get(run=fork)
    assert branch.edit == {"target": lookup_result[1], "field": "tool_result"}


def test_a_fork_from_an_edited_user_message_asks_the_model_again(
    shop, scripted_agent, operator_user, api_client_for, drive_run
):
    agent = scripted_agent([LOOKUP, GREET], ["lookup_order"])
    original = drive_run(
        run_start(
            tenant=shop,
            agent_slug=agent.slug,
            input="whose is 4821?",
            started_by=operator_user,
        )  # fmt: skip
    )
    user_entry = next(
        e for e in entries_of(original) if e[3] == "message"
        and e[4]["message"]["role"] == "user"
    )  # fmt: skip
    client = api_client_for(operator_user, shop)
    response = client.post(
        f"/api/v1/runs/{original.id}/fork/",
        {"from_entry": user_entry[1], "message": "who ordered 4821?"},
        format="json",
    )
    assert response.status_code == 201, response.content
    fork = drive_run(Run.objects.get(id=response.json()["id"]))
    # The script starts over (no reply was used before that entry): the fork
    # looks the order up itself, with the edited question in its context.
    assert fork.final_answer == f"The order is {CUSTOMER}'s."
    assert ToolCall.objects.filter(run=fork).count() == 1
    users = [m for m in fork.engine_state["messages"] if m["role"] == "user"]
    assert [m["content"] for m in users] == ["who ordered 4821?"]
    kept = EngineState.from_dict(original.engine_state).transcript.messages
    assert [m["content"] for m in kept if m["role"] == "user"] == ["whose is 4821?"]


def test_refused_retries_and_forks_write_nothing(
    shop,
    scripted_agent,
    operator_user,
    viewer_user,
    other_tenant,
    make_member,
    api_client_for,
    drive_run,
):
    agent = scripted_agent([LOOKUP, GREET], ["lookup_order"])
    original = drive_run(
        run_start(
            tenant=shop,
            agent_slug=agent.slug,
            input="whose is 4821?",
            started_by=operator_user,
        )  # fmt: skip
    )
    user_entry = next(
        e[1] for e in entries_of(original) if e[3] == "message"
        and e[4]["message"]["role"] == "user"
    )  # fmt: skip
    counts = (
        Run.objects.count(),
        SessionEntry.objects.count(),
        ToolCall.objects.count(),
    )
    client = api_client_for(operator_user, shop)
    fork = f"/api/v1/runs/{original.id}/fork/"

    def refused(body: dict[str, Any], field: str) -> None:
        response = client.post(fork, body, format="json")
        assert response.status_code == 400, response.content
        assert field in response.json()["error"]["fields"], response.json()

    refused({"from_entry": "0000ffff", "message": "x"}, "from_entry")
    refused({"from_entry": "not-hex", "message": "x"}, "from_entry")
    refused({"from_step": 7, "tool_result": "x"}, "from_step")
    refused({"message": "x"}, "from_entry")
    refused({"from_step": 0, "message": "x", "tool_result": "y"}, "message")
    refused({"from_entry": user_entry, "tool_result": "y"}, "tool_result")
    refused({"from_step": 0, "call_id": "call_nope", "tool_result": "y"}, "call_id")
    refused({"from_step": -1}, "from_step")
    # A succeeded-or-unverified run that is done is forked, not retried... but
    # an unverified one may be retried; a running one may not.
    Run.objects.filter(id=original.id).update(status=Run.Status.SUCCEEDED)
    conflict = client.post(f"/api/v1/runs/{original.id}/retry/")
    assert conflict.status_code == 409
    assert "fork it" in conflict.json()["error"]["message"]
    viewer = api_client_for(viewer_user, shop)
    assert viewer.post(f"/api/v1/runs/{original.id}/retry/").status_code == 403
    viewer_fork = viewer.post(fork, {"from_step": 0}, format="json")
    assert viewer_fork.status_code == 403
    assert viewer.get(f"/api/v1/runs/{original.id}/branches/").status_code == 200
    stranger = api_client_for(make_member(other_tenant, "sam", "admin"), other_tenant)
    assert stranger.post(f"/api/v1/runs/{original.id}/retry/").status_code == 404
    assert stranger.post(fork, {"from_step": 0}, format="json").status_code == 404
    assert stranger.get(f"/api/v1/runs/{original.id}/branches/").status_code == 404
    assert client.post(f"/api/v1/runs/{uuid.uuid4()}/retry/").status_code == 404
    after = (
        Run.objects.count(),
        SessionEntry.objects.count(),
        ToolCall.objects.count(),
    )
    assert after == counts
    assert not SessionBranch.objects.exists()


REPLACE_AGAIN = {
    "text": "Shipping a replacement after all.",
    "tool_calls": [
        {
            "id": "call_replace",
            "name": "create_replacement",
            "arguments": {"order_id": "4821", "reason": "it arrived damaged"},
        }
    ],
}


def test_a_cancelled_wait_is_retried_from_before_the_call_that_never_ran(
    shop, scripted_agent, operator_user, drive_run
):
    """The call that waited for approval was cancelled with the run: it never
    ran, so its round stays on the original and the retry asks the model
    again; a fork of the retry is a third branch of the same tree."""
    agent = scripted_agent(
        [LOOKUP, REPLACE, REPLACE_AGAIN, SHIPPED],
        ["lookup_order", "create_replacement"],
        evaluator="kettlecraft_replacement",
    )
    original = drive_run(
        run_start(
            tenant=shop,
            agent_slug=agent.slug,
            input="order 4821 broke",
            started_by=operator_user,
        )  # fmt: skip
    )
    assert original.status == "waiting_approval"
    original = run_cancel(run=original, actor=operator_user)
    assert original.status == "cancelled"
    assert ToolCall.objects.get(
        run=original, tool_name="create_replacement"
    ).status == ("cancelled")
    lookup_result = next(
        e for e in entries_of(original)
        if e[3] == "message" and e[4]["message"].get("tool_call_id") == "call_lookup"
    )  # fmt: skip

    retry = run_retry(run=original, actor=operator_user)
    marker = SessionEntry.objects.filter(run=retry).order_by("seq").first()
    assert marker is not None and marker.parent_id == lookup_result[1]
    assert retry.engine_state["messages"][-1]["tool_call_id"] == "call_lookup"
    retry = drive_run(retry)  # the model proposes it again: a new approval
    assert retry.status == "waiting_approval"
    approval_decide(
        request=ApprovalRequest.objects.get(run=retry), decided_by=operator_user,
        approve=True,
    )  # fmt: skip
    retry = drive_run(retry)
    assert retry.status == "succeeded", retry.stop_detail
    assert Replacement.objects.count() == 1
    assert ToolCall.objects.filter(run=original, tool_name="lookup_order").count() == 1
    assert not ToolCall.objects.filter(run=retry, tool_name="lookup_order").exists()

    fork = run_fork(
        run=retry,
        actor=operator_user,
        from_entry=lookup_result[1],
        tool_result={"ok": True, "data": {"customer": "Grace Hopper"}},
    )
    assert SessionBranch.objects.get(run=fork).session_root_id == original.id
    assert SessionBranch.objects.get(run=fork).number == 2
    assert fork.engine_state["messages"][-1]["content"] == json.dumps(
        {"ok": True, "data": {"customer": "Grace Hopper"}}
    )
    ids = list(SessionEntry.objects.values_list("entry_id", flat=True))
    assert len(ids) == len(set(ids))  # one id, one entry, in the whole tree
    assert [b["kind"] for b in run_branches_for(tenant=shop, run_id=fork.id)] == [
        "root",
        "retry",
        "fork",
    ]


def test_deleting_the_run_a_branch_came_from_leaves_the_branch_its_run(
    shop, scripted_agent, operator_user, admin_user, api_client_for, drive_run
):
    agent = scripted_agent([LOOKUP, GREET], ["lookup_order"])
    original = drive_run(
        run_start(
            tenant=shop,
            agent_slug=agent.slug,
            input="whose is 4821?",
            started_by=operator_user,
        )  # fmt: skip
    )
    fork = drive_run(run_fork(run=original, actor=operator_user, from_step=0))
    assert fork.final_answer == f"The order is {CUSTOMER}'s."
    run_delete(run=original, actor=admin_user)
    assert not Run.objects.filter(id=original.id).exists()
    assert not SessionBranch.objects.exists()
    client = api_client_for(operator_user, shop)
    session = client.get(f"/api/v1/runs/{fork.id}/session/")
    assert session.status_code == 409
    assert "cannot be rebuilt" in session.json()["error"]["message"]
    branches = client.get(f"/api/v1/runs/{fork.id}/branches/").json()
    assert [(b["kind"], b["run"]) for b in branches] == [("root", str(fork.id))]
    refused = client.post(
        f"/api/v1/runs/{fork.id}/fork/", {"from_step": 0}, format="json"
    )
    assert refused.status_code == 409
    assert Run.objects.count() == 1


def test_a_fork_with_an_edited_final_answer_ends_with_it_without_a_model_call(
    shop, scripted_agent, operator_user, api_client_for, drive_run
):
    agent = scripted_agent([LOOKUP, GREET], ["lookup_order"])
    original = drive_run(
        run_start(
            tenant=shop,
            agent_slug=agent.slug,
            input="whose is 4821?",
            started_by=operator_user,
        )  # fmt: skip
    )
    client = api_client_for(operator_user, shop)
    response = client.post(
        f"/api/v1/runs/{original.id}/fork/",
        {"from_step": 1, "message": "It is Ada's order."},
        format="json",
    )
    assert response.status_code == 201, response.content
    fork = drive_run(Run.objects.get(id=response.json()["id"]))
    assert (fork.status, fork.final_answer) == ("unverified", "It is Ada's order.")
    assert fork.steps == 0 and not ToolCall.objects.filter(run=fork).exists()
    assert original.final_answer == f"The order is {CUSTOMER}'s."
    # The step that called a tool is not edited as a message.
    refused = client.post(
        f"/api/v1/runs/{original.id}/fork/",
        {"from_step": 0, "message": "Never mind."},
        format="json",
    )
    assert refused.status_code == 400
    assert "message" in refused.json()["error"]["fields"]
