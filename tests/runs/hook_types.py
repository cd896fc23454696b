"""Hook types a deployment could install (settings.RUN_EXTRA_HOOK_TYPES), made
to fail: one raises, one outlasts any timeout. The tests' workers load them
from the environment, as an operator's would."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from runs.engine.hooks import HookEffect, HookEvent, HookInput, HookType

PATH = "tests.runs.hook_types.FAILING"


def _raising(params: Mapping[str, Any]) -> Any:
    def handle(hook_input: HookInput) -> HookEffect:
        raise RuntimeError("the hook's backend is down")

    return handle


def _sleeping(params: Mapping[str, Any]) -> Any:
    def handle(hook_input: HookInput) -> HookEffect:
        time.sleep(float(params.get("seconds", 5)))
        return HookEffect()

    return handle


FAILING: dict[str, HookType] = {
    "test_raise": HookType(
        (HookEvent.TOOL_RESULT, HookEvent.BEFORE_AGENT), "Raises.", _raising
    ),
    "test_sleep": HookType(
        (HookEvent.TOOL_RESULT, HookEvent.BEFORE_AGENT), "Sleeps.", _sleeping
    ),
}
