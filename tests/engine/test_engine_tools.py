from __future__ import annotations

import threading
from typing import Any

import pytest

from runs.engine.contracts import Effect, Idempotency, ToolContract, ToolSource
from runs.engine.envelope import ErrorCode, ToolFailure, ToolResult
from runs.engine.tools import (
    Tool,
    ToolContext,
    ToolRegistry,
    execute_tool,
    idempotency_key_for,
    may_rerun_after_crash,
)
from tests.engine.fakes import ORDER_SCHEMA, read_only_contract, write_contract

CTX = ToolContext.for_call("run-1", "call-1", tenant_id="t1")


def make_tool(handler: Any, contract: ToolContract | None = None, **kw: Any) -> Tool:
    return Tool(contract or read_only_contract(), handler, **kw)


def test_idempotency_key_is_derived_from_run_and_call() -> None:
    assert CTX.idempotency_key == idempotency_key_for("run-1", "call-1")
    assert idempotency_key_for("run-1", "call-1") == idempotency_key_for(
        "run-1", "call-1"
    )
    assert idempotency_key_for("run-1", "call-1") != idempotency_key_for(
        "run-2", "call-1"
    )
    assert len(CTX.idempotency_key) == 32


def test_handler_dict_becomes_a_success_envelope() -> None:
    result = execute_tool(make_tool(lambda a, c: {"seen": a}), {"order_id": "1"}, CTX)
    assert result.ok is True
    assert result.data == {"seen": {"order_id": "1"}}
    assert "latency_ms" in result.cost


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ValueError("bad date"), ErrorCode.EINVAL),
        (PermissionError("no"), ErrorCode.EACCES),
        (TimeoutError(), ErrorCode.ETIMEDOUT),
        (RuntimeError("postgres://user:secret@db"), ErrorCode.EINTERNAL),
        (ToolFailure(ErrorCode.EPATH, "outside workspace"), ErrorCode.EPATH),
    ],
)
def test_handler_exceptions_become_envelopes(exc: Exception, code: ErrorCode) -> None:
    def handler(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        raise exc

    for timeout in (None, 5.0):
        result = execute_tool(make_tool(handler), {}, CTX, timeout_seconds=timeout)
        assert result.ok is False
        assert result.error is not None
        assert result.error.code is code
        assert "secret" not in result.error.message


def test_hung_handler_times_out_with_etimedout() -> None:
    release = threading.Event()

    def hang(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        release.wait(5)
        return {}

    result = execute_tool(
        make_tool(hang, write_contract()), {}, CTX, timeout_seconds=0.05
    )
    release.set()
    assert result.error is not None
    assert result.error.code is ErrorCode.ETIMEDOUT
    assert result.error.retryable is False  # a write may have happened
    assert "may have taken effect" in result.error.message


def test_failed_precondition_is_eperm_and_the_handler_never_runs() -> None:
    ran: list[str] = []

    def refund(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        ran.append("refund")
        return {}

    tool = Tool(
        write_contract("refund"),
        refund,
        check_preconditions=lambda args, ctx: "amount exceeds refundable 20.00",
    )
    result = execute_tool(tool, {"order_id": "4821"}, CTX)
    assert result.error is not None
    assert result.error.code is ErrorCode.EPERM
    assert (
        result.error.message == "precondition failed: amount exceeds refundable 20.00"
    )
    assert ran == []


def test_handler_returning_a_non_result_is_einternal() -> None:
    result = execute_tool(make_tool(lambda a, c: 42), {}, CTX)
    assert result.error is not None
    assert result.error.code is ErrorCode.EINTERNAL


def test_handler_may_return_a_full_envelope() -> None:
    envelope = ToolResult.success({"x": 1}, refs=({"kind": "order", "id": "4821"},))
    result = execute_tool(make_tool(lambda a, c: envelope), {}, CTX)
    assert result.refs == envelope.refs


def test_registry_refuses_duplicates_and_lists_model_tools() -> None:
    registry = ToolRegistry([make_tool(lambda a, c: {})])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(make_tool(lambda a, c: {}))
    assert [t["function"]["name"] for t in registry.model_tools()] == ["lookup_order"]
    assert "lookup_order" in registry
    assert registry.get("nope") is None


def test_crash_recovery_reruns_reads_and_keyed_writes_only() -> None:
    assert may_rerun_after_crash(read_only_contract()) is True
    assert may_rerun_after_crash(write_contract()) is True  # honours the key
    unkeyed = ToolContract(
        name="send_email",
        description="d",
        input_schema=ORDER_SCHEMA,
        effect=Effect.WRITE,
        idempotency=Idempotency.NONE,
        source=ToolSource.BUILTIN,
    )
    assert may_rerun_after_crash(unkeyed) is False
    untrusted = ToolContract(
        name="mcp_tool",
        description="d",
        input_schema=ORDER_SCHEMA,
        effect=Effect.WRITE,
        idempotency=Idempotency.REQUIRED_KEY,
    )
    assert may_rerun_after_crash(untrusted) is False
