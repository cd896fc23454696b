"""The host-only contract fields take effect in real runs (scripted model, real
database): permissions, quotas per run and per tenant period, automatic retries,
and a repeated non-retryable error ending the run or asking a person."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import close_old_connections, connection

from approvals.models import ApprovalRequest
from budgets.models import ToolQuotaCounter
from budgets.quotas import tool_quota_take, tool_quota_used
from controlplane.secrets import secret_set
from runs.engine.contracts import (
    Effect,
    Idempotency,
    QuotaLimit,
    ToolContract,
    ToolCost,
    ToolSource,
)
from runs.engine.envelope import ErrorCode, ToolFailure
from runs.engine.tools import Tool, ToolContext
from runs.models import Run, ToolCall
from runs.services import run_start
from runs.services.decide import approval_decide, approvals_expire
from runs.tools.registry import BUILTIN_TOOLS
from tracing.models import RunEvent

Handler = Callable[[dict[str, Any], ToolContext], Any]


@pytest.fixture(autouse=True)
def _no_backoff(settings: Any) -> None:
    settings.RUN_TOOL_RETRY_BACKOFF_SECONDS = 0


@pytest.fixture
def register(monkeypatch: Any) -> Callable[..., list[str]]:
    """Register a read-only built-in tool for the test; returns its call log."""

    def build(name: str, handler: Handler | None = None, **fields: Any) -> list[str]:
        ran: list[str] = []

        def logged(args: dict[str, Any], ctx: ToolContext) -> Any:
            ran.append(ctx.call_id)
            return handler(args, ctx) if handler else {"n": len(ran)}

        contract = ToolContract(
            name=name,
            description=f"The {name} test tool.",
            input_schema={"type": "object", "properties": {}},
            effect=Effect.READ_ONLY,
            idempotency=Idempotency.NATURAL,
            source=ToolSource.BUILTIN,
            **fields,
        )
        monkeypatch.setitem(BUILTIN_TOOLS, name, Tool(contract, logged))
        return ran

    return build


def script(*batches: list[str]) -> list[dict[str, Any]]:
    replies: list[dict[str, Any]] = [
        {"tool_calls": [{"name": n, "arguments": {}} for n in names]}
        for names in batches
    ]
    return [*replies, {"text": "Done."}]


def start(agent: Any, user: Any = None) -> Run:
    return run_start(
        tenant=agent.tenant, agent_slug=agent.slug, input="go", started_by=user
    )


def rows(run: Run) -> list[tuple[str, str, str | None]]:
    return [
        (row.tool_name, row.status, (row.result.get("error") or {}).get("code"))
        for row in ToolCall.objects.filter(run=run).order_by("step__index", "position")
    ]


# --- auth_scope secrets ------------------------------------------------------------

ALPHA, BETA = "alpha-value-7f3e9c1d", "beta-value-2b8a6e4f"


def test_two_tools_two_secrets_each_tool_sees_only_its_own(
    register, scripted_agent, drive_run, tenant, other_tenant, admin_user
):
    secret_set(tenant=tenant, name="ALPHA_KEY", value=ALPHA, actor=admin_user)
    secret_set(tenant=tenant, name="BETA_KEY", value=BETA, actor=admin_user)
    secret_set(tenant=other_tenant, name="GAMMA_KEY", value="gamma-x9", actor=None)
    seen: dict[str, Any] = {}

    def reading(own: str, other: str) -> Handler:
        def handler(args: dict[str, Any], ctx: ToolContext) -> Any:
            seen[own] = ctx.secret(own)
            try:
                ctx.secret(other)
            except ToolFailure as refused:
                assert refused.result.error is not None
                seen[f"{own} asking for {other}"] = refused.result.error.code
            return {"authenticated": True}

        return handler

    register("alpha", reading("ALPHA_KEY", "BETA_KEY"), auth_scope="secrets:ALPHA_KEY")
    register("beta", reading("BETA_KEY", "ALPHA_KEY"), auth_scope="secrets:BETA_KEY")
    register(
        "greedy",
        lambda args, ctx: {"stolen": ctx.secret("BETA_KEY")},
        auth_scope="secrets:ALPHA_KEY",
    )
    register(  # another tenant's secret of that name is not this tenant's
        "gamma",
        lambda args, ctx: {"v": ctx.secret("GAMMA_KEY")},
        auth_scope="secrets:GAMMA_KEY",
    )
    tools = ["alpha", "beta", "greedy", "gamma"]
    agent = scripted_agent(script(tools), tools)
    run = drive_run(start(agent, admin_user))
    assert seen == {
        "ALPHA_KEY": ALPHA,
        "ALPHA_KEY asking for BETA_KEY": "EACCES",
        "BETA_KEY": BETA,
        "BETA_KEY asking for ALPHA_KEY": "EACCES",
    }
    assert rows(run) == [
        ("alpha", "succeeded", None),
        ("beta", "succeeded", None),
        ("greedy", "failed", "EACCES"),
        ("gamma", "failed", "EACCES"),
    ]
    messages = [
        r.result["error"]["message"]
        for r in ToolCall.objects.filter(run=run, status="failed").order_by("position")
    ]
    assert messages == [
        "secret 'BETA_KEY' is outside this tool's auth_scope",
        "secret 'GAMMA_KEY' is not set in this tenant",
    ]
    run.refresh_from_db()
    recorded = json.dumps(
        [run.engine_state, list(ToolCall.objects.filter(run=run).values())],
        default=str,
    )
    recorded += json.dumps(list(RunEvent.objects.filter(run=run).values()), default=str)
    for value in (ALPHA, BETA, "gamma-x9"):
        assert value not in recorded


# --- auth_scope permissions -------------------------------------------------------


def test_a_permission_the_starter_lacks_refuses_the_call_unexecuted(
    register, scripted_agent, drive_run, operator_user, admin_user
):
    ran = register("rebalance", auth_scope="permissions:budget.write")
    agent = scripted_agent(script(["rebalance"]), ["rebalance"])
    run = drive_run(start(agent, operator_user))
    assert ran == []
    assert rows(run) == [("rebalance", "refused", "EACCES")]
    observation = ToolCall.objects.get(run=run).observation["content"]
    assert "budget.write" not in observation  # the scope is not shown to the model
    assert run.status == Run.Status.UNVERIFIED  # the model heard it and answered

    run = drive_run(start(agent, admin_user))
    assert len(ran) == 1 and rows(run) == [("rebalance", "succeeded", None)]


# --- cost.quota -------------------------------------------------------------------


def test_a_per_run_quota_refuses_the_call_over_it_and_counts_per_run(
    register, scripted_agent, drive_run
):
    ran = register("search", cost=ToolCost(quota="2/run"))
    agent = scripted_agent(script(["search", "search"], ["search"]), ["search"])
    run = drive_run(start(agent))
    assert len(ran) == 2
    assert rows(run)[2] == ("search", "refused", "EBUDGET")
    row = ToolCall.objects.filter(run=run, status="refused").get()
    assert row.attempts == 0 and row.started_at is None
    assert run.engine_state["contract"]["quota_used"] == {"search": 2}
    drive_run(start(agent))  # a new run has its own two
    assert len(ran) == 4


def test_a_tenant_period_quota_holds_across_runs(
    register, scripted_agent, drive_run, tenant
):
    ran = register("geocode", cost=ToolCost(quota="maps:3/day"))
    agent = scripted_agent(script(["geocode", "geocode"]), ["geocode"])
    first = drive_run(start(agent))
    second = drive_run(start(agent))
    assert len(ran) == 3
    assert [r[1] for r in rows(first) + rows(second)] == [
        "succeeded",
        "succeeded",
        "succeeded",
        "refused",
    ]
    assert (
        "per day" in ToolCall.objects.get(status="refused").result["error"]["message"]
    )
    assert tool_quota_used(tenant_id=tenant.pk, bucket="maps", period="day") == 3


@pytest.mark.django_db(transaction=True)
def test_concurrent_quota_takes_never_exceed_the_limit(tenant):
    """8 threads, each with its own connection, race for a quota of 5 per hour
    that also sits under 100 per day: exactly 5 win, and the day counts 5."""
    limits = [QuotaLimit("api", 5, "hour"), QuotaLimit("api", 100, "day")]
    outcomes: list[QuotaLimit | None] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        try:
            barrier.wait()
            for _ in range(2):
                outcomes.append(tool_quota_take(tenant_id=tenant.pk, limits=limits))
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(outcomes) == 16
    assert outcomes.count(None) == 5
    assert {o for o in outcomes if o is not None} == {limits[0]}
    used = dict(ToolQuotaCounter.objects.values_list("period", "used"))
    assert used == {"hour": 5, "day": 5}  # a refused take took nothing


# --- retryable: bounded automatic retries -------------------------------------------


def test_a_transient_error_of_a_read_is_retried_and_the_row_counts_attempts(
    register, scripted_agent, drive_run
):
    def flaky(args: dict[str, Any], ctx: ToolContext) -> Any:
        if len(ran) < 3:
            raise ToolFailure(ErrorCode.ETIMEDOUT, "upstream slow", retryable=True)
        return {"ok": 1}

    ran = register("status", flaky)
    agent = scripted_agent(script(["status"]), ["status"])
    run = drive_run(start(agent))
    row = ToolCall.objects.get(run=run)
    assert (row.status, row.attempts, len(ran)) == ("succeeded", 3, 3)
    assert run.engine_state["contract"]["retries"] == {"status": 2}


# --- suggested_action: a repeated non-retryable error ---------------------------


def failing(code: ErrorCode, action: str) -> Handler:
    def handler(args: dict[str, Any], ctx: ToolContext) -> Any:
        raise ToolFailure(
            code, "the ledger is closed", retryable=False, suggested_action=action
        )

    return handler


def test_a_non_retryable_error_twice_ends_the_run_with_its_own_stop_reason(
    register, scripted_agent, drive_run
):
    ran = register("post", failing(ErrorCode.EINTERNAL, "do_not_retry"))
    agent = scripted_agent(script(["post"], ["post"], ["post"]), ["post"])
    run = drive_run(start(agent))
    assert len(ran) == 2  # the third call was never asked for
    assert (run.status, run.stop_reason) == ("failed", "repeated_error")
    assert "post failed 2 times in a row with EINTERNAL" in run.stop_detail


def asking_run(
    register: Any, scripted_agent: Any, drive_run: Any, slug: str = "scripted"
) -> tuple[Run, list[str]]:
    ran = register("ledger", failing(ErrorCode.EPERM, "stop_and_request_human"))
    agent = scripted_agent(
        script(["ledger"], ["ledger"], ["ledger"]), ["ledger"], slug=slug
    )
    run = drive_run(start(agent))
    assert run.status == Run.Status.WAITING_APPROVAL
    assert len(ran) == 2
    return run, ran


def test_a_repeated_error_that_asks_for_a_person_waits_then_goes_on(
    register, scripted_agent, drive_run, operator_user
):
    run, ran = asking_run(register, scripted_agent, drive_run)
    question = ApprovalRequest.objects.get(run=run)
    assert question.kind == "tool_error" and question.tool_call_id is None
    assert question.args_snapshot == {
        "code": "EPERM",
        "message": "the ledger is closed",
    }
    assert "Let the run go on?" in question.rule_reason
    approval_decide(request=question, decided_by=operator_user, approve=True)
    run = drive_run(run)
    assert len(ran) == 3  # the model went on (and tried once more)
    assert (run.status, run.stop_reason) == ("unverified", "done")


def test_a_repeated_error_denied_or_unanswered_ends_the_run(
    register, scripted_agent, drive_run, operator_user
):
    run, ran = asking_run(register, scripted_agent, drive_run)
    question = ApprovalRequest.objects.get(run=run)
    approval_decide(
        request=question, decided_by=operator_user, approve=False, reason="call IT"
    )
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("failed", "repeated_error")
    assert "denied (call IT)" in run.stop_detail
    assert len(ran) == 2

    run, ran = asking_run(register, scripted_agent, drive_run, slug="second")
    ApprovalRequest.objects.filter(run=run).update(expires_at="2000-01-01T00:00:00Z")
    assert approvals_expire() == 1
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("failed", "repeated_error")
