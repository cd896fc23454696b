"""End users' memory: the `memory` tool across runs of one end user (through a
real Celery worker), its scope and path rules, its size limits, the untrusted
label the model reads, the admins' API and retention (docs/memory.md)."""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pytest
from django.utils import timezone

from controlplane.models import AuditEvent
from runs.memory import MEMORY_TRUST_LABEL
from runs.models import MemoryFile, Run, ToolCall
from runs.services import run_start
from runs.services.retention import tenant_retention_apply
from tests.agents import make_agent

pytestmark = pytest.mark.django_db

KEPT = "chose replacement for order 4821"


def note(call_id: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "name": "memory", "arguments": arguments}]}


FIRST_CONVERSATION = [
    note("m1", command="create", path="/memories/orders.md", text=KEPT),
    {"text": "A replacement kettle is on its way."},
]
# "The new kettle leaks too. Can you sort it out like last time?" (spec §2.1 ch. 6)
FOLLOW_UP = [
    note("m1", command="view", path="/memories/orders.md"),
    note(
        "m2",
        command="edit",
        path="/memories/orders.md",
        old_text="chose replacement",
        new_text="chose replacement; the replacement leaked too",
    ),
    {"text": "Last time: {{m1.entries}} (read as {{m1.trust}})."},
]


def wait_settled(run_id: Any, timeout: float = 90) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.get(pk=run_id)
        if run.status in Run.TERMINAL:
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} still {run.status} after {timeout} s")


def start(tenant: Any, agent: str, end_user: str = "c-8812") -> Run:
    return run_start(
        tenant=tenant, agent_slug=agent, input="hi", started_by=None, end_user=end_user
    )


def calls(run: Run) -> list[ToolCall]:
    return list(ToolCall.objects.filter(run=run).order_by("step__index", "position"))


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_follow_up_a_week_later_reads_what_the_first_conversation_kept(
    tenant, operator_user, api_client_for, celery_worker_process
):
    make_agent(tenant, "first", tools=["memory"], script=FIRST_CONVERSATION)
    make_agent(tenant, "follow-up", tools=["memory"], script=FOLLOW_UP)
    api = api_client_for(operator_user, tenant)
    body = {
        "agent": "first",
        "input": "Order #4821 arrived damaged.",
        "end_user": "c-8812",
    }
    created = api.post("/api/v1/runs/", body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["end_user"] == "c-8812"
    first = wait_settled(created.json()["id"])
    assert first.status == Run.Status.UNVERIFIED, first.stop_detail

    [stored] = MemoryFile.objects.filter(tenant=tenant, end_user="c-8812")
    today = timezone.now().date().isoformat()
    assert stored.path == "/memories/orders.md"
    assert [(e["date"], e["text"]) for e in stored.entries] == [(today, KEPT)]

    body = {
        "agent": "follow-up",
        "input": "The new kettle leaks too.",
        "end_user": "c-8812",
    }
    created = api.post("/api/v1/runs/", body, format="json")
    second = wait_settled(created.json()["id"])
    assert second.status == Run.Status.UNVERIFIED, second.stop_detail
    # The model read the first conversation's dated entry, labelled untrusted.
    assert f"{today} · {KEPT}" in second.final_answer
    assert MEMORY_TRUST_LABEL in second.final_answer
    view, edit = calls(second)
    seen = json.loads(view.observation["content"])
    assert seen["trust"] == "tool_output_untrusted"
    assert seen["data"]["trust"] == MEMORY_TRUST_LABEL
    assert "not instructions" in seen["data"]["notice"]
    assert edit.status == ToolCall.Status.SUCCEEDED, edit.result
    stored.refresh_from_db()
    assert [e["text"] for e in stored.entries] == [
        "chose replacement; the replacement leaked too for order 4821"
    ]
    detail = api.get(f"/api/v1/runs/{second.id}/").json()
    assert detail["end_user"] == "c-8812"


def test_another_end_user_and_another_tenant_see_nothing(
    tenant, other_tenant, drive_run
):
    MemoryFile.objects.create(
        tenant=tenant, end_user="c-8812", path="/memories/orders.md",
        entries=[{"date": "2026-10-29", "text": KEPT, "key": ""}], size_chars=len(KEPT),
    )  # fmt: skip
    look = [note("m1", command="view", path="/memories/orders.md"), {"text": "ok"}]
    make_agent(tenant, "look", tools=["memory"], script=look)
    make_agent(other_tenant, "look", tools=["memory"], script=look)
    for run in (start(tenant, "look", "c-9999"), start(other_tenant, "look")):
        run = drive_run(run)
        [view] = calls(run)
        assert view.status == ToolCall.Status.FAILED
        assert view.result["error"]["code"] == "EINVAL"
        assert (
            "nothing is stored at /memories/orders.md"
            in view.result["error"]["message"]
        )
        assert KEPT not in json.dumps(view.observation)


@pytest.mark.parametrize(
    "path", ["../c-9999/x", "/memories/../c-9999/x", "/etc/passwd", "/memories/./x"]
)
def test_a_path_outside_the_users_memory_is_refused_and_nothing_is_written(
    tenant, drive_run, path
):
    script = [note("m1", command="create", path=path, text="x"), {"text": "ok"}]
    make_agent(tenant, "escape", tools=["memory"], script=script)
    run = drive_run(start(tenant, "escape"))
    [call] = calls(run)
    assert call.result["error"]["code"] == "EPATH"
    assert "outside this user's memory" in call.result["error"]["message"]
    assert not MemoryFile.objects.exists()


def test_a_run_without_an_end_user_gets_a_clear_error_and_no_memory(tenant, drive_run):
    script = [
        note("m1", command="create", path="/memories/a.md", text="x"),
        {"text": "ok"},
    ]
    make_agent(tenant, "anon", tools=["memory"], script=script)
    run = drive_run(start(tenant, "anon", end_user=""))
    [call] = calls(run)
    assert call.result["error"]["code"] == "EACCES"
    assert "serves no end user" in call.result["error"]["message"]
    assert not MemoryFile.objects.exists()


def test_an_entry_or_a_user_over_the_size_limits_is_refused_with_nothing_written(
    tenant, drive_run, settings
):
    settings.MEMORY_MAX_ENTRY_CHARS = 40
    settings.MEMORY_MAX_USER_CHARS = 50
    script = [
        note("m1", command="create", path="/memories/a.md", text="y" * 41),
        note("m2", command="create", path="/memories/a.md", text="z" * 30),
        note("m3", command="create", path="/memories/b.md", text="w" * 30),
        {"text": "ok"},
    ]
    make_agent(tenant, "big", tools=["memory"], script=script)
    run = drive_run(start(tenant, "big"))
    too_long, kept, over_quota = calls(run)
    assert too_long.result["error"]["code"] == "EINVAL"
    assert "at most 40" in too_long.result["error"]["message"]
    assert kept.status == ToolCall.Status.SUCCEEDED
    assert over_quota.result["error"]["code"] == "EDISK"
    assert "holds 30 of 50" in over_quota.result["error"]["message"]
    assert list(MemoryFile.objects.values_list("path", "size_chars")) == [
        ("/memories/a.md", 30)
    ]


def test_a_bad_end_user_is_a_400_naming_it_and_starts_nothing(
    tenant, operator_user, api_client_for
):
    make_agent(tenant, "first", tools=["memory"], script=FIRST_CONVERSATION)
    api = api_client_for(operator_user, tenant)
    for bad in ("../c-9999", "a b", "x" * 129):
        body = {"agent": "first", "input": "hi", "end_user": bad}
        response = api.post("/api/v1/runs/", body, format="json")
        assert response.status_code == 400
        assert "end_user" in response.json()["error"]["fields"]
    assert not Run.objects.exists()


def _kept(tenant: Any, end_user: str = "c-8812") -> MemoryFile:
    return MemoryFile.objects.create(
        tenant=tenant, end_user=end_user, path="/memories/orders.md",
        entries=[{"date": "2026-10-29", "text": KEPT, "key": ""}], size_chars=len(KEPT),
    )  # fmt: skip


def test_admins_read_and_delete_a_users_memory_viewers_may_not_delete(
    tenant, other_tenant, admin_user, viewer_user, api_client_for, make_member
):
    _kept(tenant)
    _kept(tenant, "c-1234")
    viewer = api_client_for(viewer_user, tenant)
    listed = viewer.get("/api/v1/end-users/").json()
    assert [u["end_user"] for u in listed] == ["c-1234", "c-8812"]
    read = viewer.get("/api/v1/end-users/c-8812/memory/").json()
    assert read["files"][0]["entries"][0]["line"] == f"2026-10-29 · {KEPT}"

    assert viewer.delete("/api/v1/end-users/c-8812/memory/").status_code == 403
    assert MemoryFile.objects.filter(end_user="c-8812").count() == 1

    outsider = api_client_for(make_member(other_tenant, "olga", "admin"), other_tenant)
    assert outsider.get("/api/v1/end-users/c-8812/memory/").status_code == 404
    assert outsider.delete("/api/v1/end-users/c-8812/memory/").status_code == 404
    assert MemoryFile.objects.filter(end_user="c-8812").count() == 1

    admin = api_client_for(admin_user, tenant)
    deleted = admin.delete("/api/v1/end-users/c-8812/memory/")
    assert deleted.json() == {"end_user": "c-8812", "deleted": 1}
    assert list(MemoryFile.objects.values_list("end_user", flat=True)) == ["c-1234"]
    assert admin.get("/api/v1/end-users/c-8812/memory/").status_code == 404
    audit = AuditEvent.objects.get(action="memory.delete")
    assert audit.object_id == "c-8812"
    assert audit.before == {"paths": ["/memories/orders.md"]}


def test_the_end_user_page_lists_the_memory_and_offers_admins_a_delete(
    tenant, admin_user, viewer_user, client
):
    _kept(tenant)
    client.force_login(viewer_user)
    page = client.get("/end-users/c-8812/")
    assert page.status_code == 200
    assert b'data-end-user="c-8812"' in page.content
    assert b'id="delete-memory"' not in page.content
    client.force_login(admin_user)
    assert b'id="delete-memory"' in client.get("/end-users/c-8812/").content


def test_retention_deletes_memory_nobody_wrote_since_the_cutoff(tenant):
    old = _kept(tenant, "c-old")
    fresh = _kept(tenant, "c-fresh")
    MemoryFile.objects.filter(id=old.id).update(
        updated_at=timezone.now() - dt.timedelta(days=40)
    )
    report = tenant_retention_apply(tenant=tenant, retention_days=30)
    assert report.memory_files == 1
    assert list(MemoryFile.objects.values_list("id", flat=True)) == [fresh.id]
    audit = AuditEvent.objects.get(action="data.retention")
    assert audit.after["memory_files"] == 1
