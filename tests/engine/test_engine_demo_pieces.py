"""The engine pieces the demo scripts stand on (docs/demo.md): the `escalate`
hook type, the scripted model's `if_message` branch, and a schema error that
carries the field's description."""

from __future__ import annotations

import json

import pytest

from runs.engine.adapters.scripted import ScriptedModel, script_entry_problems
from runs.engine.guarding import ParamError
from runs.engine.hooks import (
    DEFAULT_ESCALATION,
    HOOK_TYPES,
    HookInput,
    HookStatus,
    hook_from_dict,
    run_hook,
)
from runs.engine.validation import prepare_schema, validate_arguments


def test_escalate_answers_a_budget_stop_and_ignores_any_other() -> None:
    spec = hook_from_dict({"type": "escalate", "event": "run_finished"}, HOOK_TYPES)
    stopped = run_hook(spec, HOOK_TYPES, HookInput("r", stop_reason="max_steps"))
    assert stopped.status is HookStatus.OK
    assert stopped.effect.escalate == DEFAULT_ESCALATION
    done = run_hook(spec, HOOK_TYPES, HookInput("r", stop_reason="done"))
    assert done.effect.escalate == ""


def test_escalate_refuses_bad_params_and_other_events() -> None:
    with pytest.raises(ParamError, match="stop_reasons must be a list"):
        hook_from_dict(
            {"type": "escalate", "params": {"stop_reasons": "max_steps"}}, HOOK_TYPES
        )
    with pytest.raises(ParamError, match="escalate hooks run on run_finished"):
        hook_from_dict({"type": "escalate", "event": "tool_result"}, HOOK_TYPES)


def _denied(message: str) -> list[dict[str, object]]:
    body = {"ok": False, "error": {"code": "EPERM", "message": message}}
    return [{"role": "tool", "tool_call_id": "c1", "content": json.dumps(body)}]


SCRIPT = [
    {
        "text": "fallback",
        "on_error": {
            "c1": {
                "text": "could not: {{c1.message}}",
                "if_message": {"photo": {"text": "Could you send a photo?"}},
            }
        },
    }
]


def test_if_message_picks_the_reply_for_the_words_of_the_error() -> None:
    photo = ScriptedModel(SCRIPT).complete(
        _denied("denied: Ask the customer for a PHOTO first"), [], 100
    )
    assert photo.text == "Could you send a photo?"
    other = ScriptedModel(SCRIPT).complete(_denied("denied: refunded"), [], 100)
    assert other.text == "could not: denied: refunded"
    assert script_entry_problems({"if_message": ["photo"]}, "script[0]") == [
        "script[0].if_message must map words to a reply"
    ]


def test_a_pattern_error_says_what_the_field_expects() -> None:
    schema = prepare_schema(
        {
            "type": "object",
            "properties": {
                "order_id": {
                    "type": "string",
                    "pattern": "^[0-9]{4}$",
                    "description": 'Order number without "#", e.g. "4821".',
                }
            },
        }
    )
    assert validate_arguments(schema, {"order_id": "#4821"}) == [
        "$.order_id: '#4821' does not match '^[0-9]{4}$'; expected: Order number "
        'without "#", e.g. "4821".'
    ]
