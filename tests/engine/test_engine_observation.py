from __future__ import annotations

import json

from runs.engine.envelope import ErrorCode, ToolResult
from runs.engine.observation import TRUST_LABEL, observe


def test_small_result_is_passed_whole_with_the_trust_label() -> None:
    observation, artifact = observe("c1", "lookup_order", ToolResult.success({"a": 1}))
    assert artifact is None
    assert observation.truncated is False
    body = json.loads(observation.content)
    assert body == {
        "trust": TRUST_LABEL,
        "tool": "lookup_order",
        "ok": True,
        "data": {"a": 1},
        "error": None,
        "refs": [],
    }
    assert observation.to_message() == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": observation.content,
    }


def test_large_result_becomes_a_bounded_preview_plus_an_artifact() -> None:
    result = ToolResult.success({"log": "line\n" * 50_000})
    observation, artifact = observe("c1", "run_code", result, limit_chars=2000)
    assert observation.truncated is True
    assert len(observation.content) <= 2000
    body = json.loads(observation.content)  # still valid JSON
    assert body["trust"] == TRUST_LABEL
    assert body["truncated"] is True
    assert body["full_size_bytes"] == observation.full_size_bytes > 250_000
    assert body["data_preview"].startswith('{"log":"line\\nline')
    assert artifact is not None
    assert artifact.size_bytes == observation.full_size_bytes
    assert json.loads(artifact.content)["data"] == {"log": "line\n" * 50_000}
    assert body["artifact_sha256"] == artifact.sha256


def test_preview_of_escape_heavy_output_still_fits() -> None:
    result = ToolResult.success({"quotes": '"\\' * 10_000, "emoji": "☕" * 5000})
    observation, _ = observe("c1", "t", result, limit_chars=500)
    assert len(observation.content) <= 500
    json.loads(observation.content)


def test_error_survives_truncation_intact() -> None:
    result = ToolResult.failure(ErrorCode.EOUTPUT, "too much", data="x" * 10_000)
    observation, _ = observe("c1", "t", result, limit_chars=1000)
    body = json.loads(observation.content)
    assert body["ok"] is False
    assert body["error"]["code"] == "EOUTPUT"
    assert body["error"]["message"] == "too much"
