"""No-progress detection: the same action, observation and world version repeated.

The window is max retries + 1, so ordinary retries are not mistaken for a loop. The
state is a plain list of fingerprints so the host can persist it between steps.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_RETRIES = 3


def canonical_json(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )


def step_fingerprint(action: Any, observation: Any, world_version: Any = None) -> str:
    """SHA-256 of canonical JSON of action + observation + world version, 16 hex."""
    payload = canonical_json(
        {"action": action, "observation": observation, "world": world_version}
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


@dataclass
class ProgressTracker:
    """Remembers the last `window` fingerprints of a run."""

    window: int = DEFAULT_MAX_RETRIES + 1
    recent: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.window < 2:
            raise ValueError("the no-progress window must be at least 2")

    def record(self, fingerprint: str) -> bool:
        """Add a step's fingerprint; True when the whole window is one fingerprint."""
        self.recent.append(fingerprint)
        del self.recent[: -self.window]
        return len(self.recent) == self.window and len(set(self.recent)) == 1

    def to_dict(self) -> dict[str, Any]:
        return {"window": self.window, "recent": list(self.recent)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ProgressTracker:
        data = data or {}
        return cls(
            window=int(data.get("window", DEFAULT_MAX_RETRIES + 1)),
            recent=[str(f) for f in data.get("recent", [])],
        )
