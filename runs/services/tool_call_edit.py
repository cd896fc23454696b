"""A reviewer's edit of a waiting call's arguments (approvals app → runs write)."""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction

from runs.models import ToolCall


@transaction.atomic
def tool_call_args_replace(
    *, tool_call: ToolCall, args: dict[str, Any], args_sha256: str
) -> int:
    """Replace the arguments of a call still waiting for approval; returns rows."""
    updated = ToolCall.objects.filter(
        id=tool_call.id, status=ToolCall.Status.WAITING_APPROVAL
    ).update(args=args, raw_args=json.dumps(args), args_sha256=args_sha256)
    tool_call.refresh_from_db()
    return updated
