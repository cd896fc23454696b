"""The host-only contract fields take effect in the engine: auth_scope's secrets,
per-run quotas, declared preconditions, automatic retries and repeated errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runs.engine.adapters.scripted import ScriptedModel
from runs.engine.budget import BudgetLimits
from runs.engine.contracts import (
    ContractError,
    Effect,
    Idempotency,
    QuotaLimit,
    ToolContract,
    ToolCost,
    ToolSource,
    parse_auth_scope,
    parse_quota,
)
from runs.engine.enforcement import REPEATED_ERROR_RULE, RetryPolicy
from runs.engine.envelope import ErrorCode, ToolFailure, ToolResult
from runs.engine.loop import (
    AgentConfig,
    ApprovalResolution,
    LoopResult,
    run_in_process,
)
from runs.engine.stop import RunStatus, StopReason
from runs.engine.tools import Tool, ToolContext, ToolRegistry

SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
CONFIG = AgentConfig(name="a", reserve_output_tokens=50)
SECRETS = {"ALPHA_KEY": "alpha-value", "BETA_KEY": "beta-value"}


def contract(name: str, **fields: Any) -> ToolContract:
    fields.setdefault("effect", Effect.READ_ONLY)
    fields.setdefault("idempotency", Idempotency.NATURAL)
    return ToolContract(
        name=name,
        description=f"The {name} tool.",
        input_schema=SCHEMA,
        source=ToolSource.BUILTIN,
        **fields,
    )


def calls(*names: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": {}} for name in names]}


def run(tools: list[Tool], script: list[dict[str, Any]], **kw: Any) -> LoopResult:
    kw.setdefault("sleep", lambda seconds: None)
    return run_in_process(
        kw.pop("config", CONFIG),
        ScriptedModel([*script, {"text": "done"}]),
        ToolRegistry(tools),
        user_input="go",
        **kw,
    )


def results(result: LoopResult) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in result.messages if m["role"] == "tool"]


def secret_reader(name: str) -> str:
    if name not in SECRETS:
        raise LookupError(f"secret {name!r} is not set in this tenant")
    return SECRETS[name]


# --- notation ----------------------------------------------------------------------


def test_auth_scope_notation_names_secrets_permissions_and_external_scopes() -> None:
    scope = parse_auth_scope("secrets:A_KEY,B permissions:budget.write pay:refund")
    assert scope.secrets == {"A_KEY", "B"}
    assert scope.permissions == {"budget.write"}
    assert scope.external == ("pay:refund",)
    assert parse_auth_scope(None) == parse_auth_scope("")


@pytest.mark.parametrize(
    "text", ["secrets:1BAD", "permissions:Refund", "secrets:", "just-a-word"]
)
def test_a_malformed_auth_scope_is_refused_when_the_contract_is_built(
    text: str,
) -> None:
    with pytest.raises(ContractError, match="auth_scope"):
        contract("t", auth_scope=text)


def test_quota_notation_per_run_per_period_and_shared_buckets() -> None:
    assert parse_quota("5/run;billing:100/day", tool_name="t") == (
        QuotaLimit("t", 5, "run"),
        QuotaLimit("billing", 100, "day"),
    )
    for bad in ("5", "5/fortnight", "x/run", "-1/run"):
        with pytest.raises(ContractError, match=r"cost\.quota"):
            contract("t", cost=ToolCost(quota=bad))


def test_declared_preconditions_need_a_check_that_enforces_them() -> None:
    declared = contract("t", preconditions=("the order is paid",))
    with pytest.raises(ContractError, match="no check"):
        Tool(declared, lambda args, ctx: {})
    Tool(declared, lambda args, ctx: {}, check_preconditions=lambda a, c: None)


# --- auth_scope: secrets -------------------------------------------------------------


def test_two_tools_two_secrets_each_tool_sees_only_its_own() -> None:
    seen: dict[str, list[Any]] = {"alpha": [], "beta": []}

    def reader(tool: str, other: str) -> Any:
        def handler(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
            seen[tool].append(ctx.secret(f"{tool.upper()}_KEY"))
            try:
                ctx.secret(f"{other.upper()}_KEY")
            except ToolFailure as refused:
                assert refused.result.error is not None
                seen[tool].append(refused.result.error.code)
            return {"ok": True}

        return handler

    alpha = Tool(
        contract("alpha", auth_scope="secrets:ALPHA_KEY"), reader("alpha", "beta")
    )
    beta = Tool(
        contract("beta", auth_scope="secrets:BETA_KEY"), reader("beta", "alpha")
    )
    result = run([alpha, beta], [calls("alpha", "beta")], secrets=secret_reader)
    assert result.status is RunStatus.UNVERIFIED
    assert seen == {
        "alpha": ["alpha-value", ErrorCode.EACCES],
        "beta": ["beta-value", ErrorCode.EACCES],
    }
    # No value reaches the transcript the model reads.
    assert "alpha-value" not in json.dumps(result.messages)
    assert "beta-value" not in json.dumps(result.messages)


def test_a_secret_the_call_read_is_taken_out_of_its_result() -> None:
    """A tool (a server) that says back the secret it was handed: the value
    leaves its data, its error message and its refs before the model sees them."""

    def echo(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        value = ctx.secret("ALPHA_KEY")
        return ToolResult.failure(
            ErrorCode.EPERM,
            f"refused key {value}",
            data={"said": value, "nested": [f'{{"k": "{value}"}}'], value: 1},
            refs=({"kind": "note", "id": value},),
        )

    tool = Tool(contract("echo", auth_scope="secrets:ALPHA_KEY"), echo)
    result = run([tool], [calls("echo")], secrets=secret_reader)
    said = json.dumps(result.messages)
    assert "alpha-value" not in said
    assert "refused key [REDACTED]" in said
    observed = result.steps[0].results[0]
    assert observed.error is not None
    assert observed.error.message == "refused key [REDACTED]"
    assert observed.data == {
        "said": "[REDACTED]",
        "nested": ['{"k": "[REDACTED]"}'],
        "[REDACTED]": 1,
    }
    assert observed.refs == ({"kind": "note", "id": "[REDACTED]"},)


def test_a_secret_outside_the_scope_is_an_eacces_result_without_its_value() -> None:
    greedy = Tool(
        contract("greedy", auth_scope="secrets:ALPHA_KEY"),
        lambda args, ctx: {"stolen": ctx.secret("BETA_KEY")},
    )
    unscoped = Tool(
        contract("unscoped"), lambda args, ctx: {"v": ctx.secret("ALPHA_KEY")}
    )
    result = run(
        [greedy, unscoped], [calls("greedy", "unscoped")], secrets=secret_reader
    )
    errors = [r["error"] for r in results(result)]
    assert [e["code"] for e in errors] == ["EACCES", "EACCES"]
    assert "outside this tool's auth_scope" in errors[0]["message"]
    assert errors[0]["retryable"] is False
    assert "beta-value" not in json.dumps(result.messages)


def test_a_scoped_secret_that_is_not_set_is_named_in_an_eacces_result() -> None:
    tool = Tool(
        contract("needy", auth_scope="secrets:GAMMA_KEY"),
        lambda args, ctx: {"v": ctx.secret("GAMMA_KEY")},
    )
    result = run([tool], [calls("needy")], secrets=secret_reader)
    error = results(result)[0]["error"]
    assert error["code"] == "EACCES"
    assert error["message"] == "secret 'GAMMA_KEY' is not set in this tenant"


# --- cost.quota per run ---------------------------------------------------------


def test_a_per_run_quota_refuses_the_call_over_it_without_executing() -> None:
    ran: list[str] = []
    tool = Tool(
        contract("search", cost=ToolCost(quota="2/run")),
        lambda args, ctx: ran.append(ctx.call_id) or {"hits": 1},
    )
    result = run([tool], [calls("search", "search"), calls("search")])
    assert len(ran) == 2  # the third was never executed
    third = results(result)[2]
    assert third["error"]["code"] == "EBUDGET"
    assert "quota of 2 call(s) per run" in third["error"]["message"]
    assert result.state.contract.quota_used == {"search": 2}
    assert result.steps[1].executed == []


def test_tools_sharing_a_quota_bucket_count_together() -> None:
    ran: list[str] = []
    tools = [
        Tool(
            contract(name, cost=ToolCost(quota="billing:1/run")),
            lambda args, ctx, name=name: ran.append(name) or {},
        )
        for name in ("charge", "invoice")
    ]
    result = run(tools, [calls("charge", "invoice")])
    assert ran == ["charge"]
    assert results(result)[1]["error"]["code"] == "EBUDGET"


# --- retryable drives automatic retries ------------------------------------------


def flaky(failures: int, code: ErrorCode = ErrorCode.ETIMEDOUT, **fields: Any) -> Any:
    attempts: list[int] = []

    def handler(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        attempts.append(1)
        if len(attempts) <= failures:
            raise ToolFailure(code, "the upstream did not answer", retryable=True)
        return {"attempt": len(attempts)}

    return handler, attempts


def test_a_retryable_error_of_a_read_is_retried_with_backoff_and_bounded() -> None:
    handler, attempts = flaky(2)
    waits: list[float] = []
    tool = Tool(contract("read"), handler)
    result = run([tool], [calls("read")], sleep=waits.append)
    assert len(attempts) == 3 and len(waits) == 2
    assert waits[1] > waits[0] * 0.5  # exponential, jittered
    recorded = result.steps[0].results[0]
    assert recorded.ok is True and recorded.cost["attempts"] == 3

    handler, attempts = flaky(10)
    tool = Tool(contract("read"), handler)
    result = run([tool], [calls("read")])
    assert len(attempts) == 1 + RetryPolicy().max_per_tool  # per tool per run
    assert results(result)[0]["error"]["code"] == "ETIMEDOUT"


def test_retries_are_a_per_tool_budget_over_the_whole_run() -> None:
    handler, attempts = flaky(100)
    config = AgentConfig(name="a", reserve_output_tokens=50, retry=RetryPolicy(2))
    tool = Tool(contract("read"), handler)
    result = run([tool], [calls("read"), calls("read")], config=config)
    assert len(attempts) == 2 + 2  # two calls, two retries in all
    assert result.state.contract.retries == {"read": 2}


def test_no_retry_starts_past_the_calls_time_or_the_runs_deadline() -> None:
    handler, attempts = flaky(1)
    config = AgentConfig(
        name="a", reserve_output_tokens=50, retry=RetryPolicy(max_call_seconds=0)
    )
    run([Tool(contract("read"), handler)], [calls("read")], config=config)
    assert len(attempts) == 1

    handler, attempts = flaky(1)
    slow = RetryPolicy(
        backoff_seconds=100, max_backoff_seconds=100, max_call_seconds=1000
    )
    config = AgentConfig(name="a", reserve_output_tokens=50, retry=slow)
    # The jittered wait is 50-150 s: every draw passes a 40 s deadline (a 60 s
    # one let a tenth of the draws retry).
    limits = BudgetLimits(max_wall_seconds=40)
    run(
        [Tool(contract("read"), handler)], [calls("read")], config=config, limits=limits
    )
    assert len(attempts) == 1


def test_irreversible_writes_and_permission_errors_are_never_retried() -> None:
    handler, attempts = flaky(5)
    write = Tool(
        contract(
            "pay", effect=Effect.IRREVERSIBLE_EXTERNAL, idempotency=Idempotency.NONE
        ),
        handler,
    )
    run([write], [calls("pay")], approver=lambda *a: ApprovalResolution(True))
    assert len(attempts) == 1
    handler, attempts = flaky(5, ErrorCode.EACCES)
    run([Tool(contract("read"), handler)], [calls("read")])
    assert len(attempts) == 1


# --- suggested_action drives a repeated non-retryable error --------------------------


def failing(code: ErrorCode, suggested_action: str | None = None) -> Any:
    ran: list[int] = []

    def handler(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        ran.append(1)
        raise ToolFailure(
            code,
            "the ledger refused",
            retryable=False,
            suggested_action=suggested_action,
        )

    return handler, ran


def test_a_non_retryable_error_twice_ends_the_run_repeated_error() -> None:
    handler, ran = failing(ErrorCode.EINTERNAL, "do_not_retry")
    tool = Tool(contract("post"), handler)
    result = run([tool], [calls("post"), calls("post"), calls("post")])
    assert result.stop_reason is StopReason.REPEATED_ERROR
    assert result.status is RunStatus.FAILED
    assert len(ran) == 2  # the third call was never asked for


def test_a_success_or_another_code_in_between_starts_the_count_over() -> None:
    outcomes = iter(
        [ErrorCode.EINTERNAL, None, ErrorCode.EINTERNAL, ErrorCode.EDISK, None]
    )

    def handler(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        code = next(outcomes)
        if code is not None:
            raise ToolFailure(code, "no", retryable=False, suggested_action="x")
        return {}

    tool = Tool(contract("post"), handler)
    result = run([tool], [calls("post")] * 5)
    assert result.stop_reason is StopReason.DONE


def test_a_repeated_error_asking_for_a_person_asks_the_approver() -> None:
    asked: list[str] = []

    def approver(call: Any, tool: Tool, decision: Any) -> ApprovalResolution:
        asked.append(f"{decision.rule}: {decision.reason}")
        return ApprovalResolution(approved=len(asked) == 1)

    handler, ran = failing(ErrorCode.EPERM, "stop_and_request_human")
    tool = Tool(contract("post"), handler)
    result = run([tool], [calls("post")] * 4, approver=approver)
    assert len(ran) == 4  # a person let it go on once; the second time, no
    assert result.stop_reason is StopReason.REPEATED_ERROR
    assert asked[0].startswith(f"{REPEATED_ERROR_RULE}: post failed 2 times")
    assert len(asked) == 2
