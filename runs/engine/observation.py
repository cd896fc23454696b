"""Bounded observations: what the model gets back from a tool call.

The model sees at most `limit` characters, always valid JSON, labelled
`tool_output_untrusted`. When the result is larger, it sees a preview plus the full
size, and the full result is handed to the host as an artifact to store.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from runs.engine.envelope import ToolResult

TRUST_LABEL = "tool_output_untrusted"
DEFAULT_OBSERVATION_CHARS = 8000
_MIN_PREVIEW_CHARS = 64


@dataclass(frozen=True)
class Artifact:
    """The full output of a tool call, for the host to store outside the log."""

    call_id: str
    sha256: str
    size_bytes: int
    media_type: str
    content: bytes


@dataclass(frozen=True)
class Observation:
    call_id: str
    tool_name: str
    ok: bool
    content: str  # the JSON text the model reads
    full_size_bytes: int
    truncated: bool
    sha256: str  # of the full result JSON
    trust: str = TRUST_LABEL

    def to_message(self) -> dict[str, Any]:
        """The chat `tool` message answering this call."""
        return {"role": "tool", "tool_call_id": self.call_id, "content": self.content}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def observe(
    call_id: str,
    tool_name: str,
    result: ToolResult,
    *,
    limit_chars: int = DEFAULT_OBSERVATION_CHARS,
) -> tuple[Observation, Artifact | None]:
    """Bound a result for the model; return the full result as an artifact if cut."""
    body: dict[str, Any] = {
        "trust": TRUST_LABEL,
        "tool": tool_name,
        "ok": result.ok,
        "data": result.data,
        "error": None if result.error is None else result.error.to_dict(),
        "refs": [dict(ref) for ref in result.refs],
    }
    full = _dumps(body)
    full_bytes = full.encode("utf-8")
    digest = hashlib.sha256(full_bytes).hexdigest()
    if len(full) <= limit_chars:
        observation = Observation(
            call_id, tool_name, result.ok, full, len(full_bytes), False, digest
        )
        return observation, None
    data_json = _dumps(result.data)
    preview_chars = max(limit_chars, _MIN_PREVIEW_CHARS)
    while True:
        bounded = {
            **body,
            "data": None,
            "refs": body["refs"][:10],
            "truncated": True,
            "full_size_bytes": len(full_bytes),
            "artifact_sha256": digest,
            "data_preview": data_json[:preview_chars],
        }
        content = _dumps(bounded)
        if len(content) <= limit_chars or preview_chars == 0:
            break
        # JSON escaping can grow the preview; shrink by the overshoot and retry.
        preview_chars = max(0, preview_chars - (len(content) - limit_chars) - 8)
    observation = Observation(
        call_id, tool_name, result.ok, content, len(full_bytes), True, digest
    )
    artifact = Artifact(
        call_id, digest, len(full_bytes), "application/json", full_bytes
    )
    return observation, artifact
