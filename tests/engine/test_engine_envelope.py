from __future__ import annotations

import json

import pytest

from runs.engine.envelope import ErrorCode, ToolError, ToolFailure, ToolResult


def test_success_envelope_has_the_six_fields() -> None:
    result = ToolResult.success(
        {"status": "delivered"}, refs=({"kind": "order", "id": "4821"},)
    )
    data = result.to_dict()
    assert set(data) == {"ok", "data", "error", "refs", "cost", "observed_at"}
    assert data["ok"] is True
    assert data["error"] is None
    assert data["observed_at"].endswith("Z")


def test_failure_takes_the_code_defaults() -> None:
    result = ToolResult.failure(
        ErrorCode.EPERM, "refund amount 90000 exceeds refundable 20000"
    )
    assert result.error == ToolError(
        ErrorCode.EPERM,
        "refund amount 90000 exceeds refundable 20000",
        retryable=False,
        suggested_action="stop_and_request_human",
    )


def test_einval_is_retryable_and_eacces_never_is() -> None:
    assert ToolError.of(ErrorCode.EINVAL, "x").retryable is True
    assert ToolError.of(ErrorCode.EACCES, "x").retryable is False


@pytest.mark.parametrize("code", list(ErrorCode))
def test_envelope_round_trips_through_json(code: ErrorCode) -> None:
    result = ToolResult.failure(code, "m", data={"n": 1}, cost={"latency_ms": 3})
    restored = ToolResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert restored == result


def test_tool_failure_carries_its_envelope() -> None:
    failure = ToolFailure(ErrorCode.EPATH, "path escapes the workspace")
    assert failure.result.ok is False
    assert failure.result.error is not None
    assert failure.result.error.code is ErrorCode.EPATH


def test_design_error_codes_all_exist() -> None:
    for code in [
        "EINVAL",
        "ENOTOOL",
        "EBUDGET",
        "EPERM",
        "EACCES",
        "ETIMEDOUT",
        "EPATH",
        "EDISK",
        "EOUTPUT",
        "EUNKNOWN",
    ]:
        assert ErrorCode(code).value == code
