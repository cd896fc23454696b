"""`ask_human`: the agent asks a person a question and waits for the answer.

The call never runs a handler: the step opens a Question (approvals.models) and
the run waits in `waiting_input`, holding no worker; the answer (or word that
none came before the question expired) becomes the call's observation
(runs/services/questions.py, docs/engine.md "Questions to a human").
"""

from __future__ import annotations

from typing import Any

from runs.engine.contracts import (
    ApprovalNeed,
    Effect,
    Idempotency,
    ToolContract,
    ToolSource,
)
from runs.engine.envelope import ErrorCode, ToolFailure
from runs.engine.tools import Tool, ToolContext

ASK_HUMAN = "ask_human"
QUESTION_MAX_CHARS = 4_000
CHOICE_MAX_CHARS = 200
MAX_CHOICES = 20


def ask_human(arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    # The step intercepts the call before any handler (runs.services.questions):
    # reaching here means a host path forgot to, and a person was never asked.
    raise ToolFailure(
        ErrorCode.EINTERNAL, "ask_human is answered by a person, not executed"
    )


ASK_HUMAN_TOOL = Tool(
    ToolContract(
        name=ASK_HUMAN,
        description=(
            "Ask a person (an operator of this system) a question and wait for "
            "the answer, e.g. to confirm a choice or get a fact no tool has. "
            "Give `choices` when the answer must be one of a few options. The "
            "answer comes back as this tool's result; if nobody answers in time "
            "the result says so."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "question": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": QUESTION_MAX_CHARS,
                },
                "choices": {
                    "type": "array",
                    "items": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": CHOICE_MAX_CHARS,
                    },
                    "minItems": 1,
                    "maxItems": MAX_CHOICES,
                    "uniqueItems": True,
                },
            },
            "required": ["question"],
            "additionalProperties": False,
        },
        effect=Effect.READ_ONLY,
        idempotency=Idempotency.NATURAL,
        approval=ApprovalNeed.NEVER,
        source=ToolSource.BUILTIN,
    ),
    ask_human,
    timeout_seconds=None,
)
