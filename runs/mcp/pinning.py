"""Pinning: a server's listing against the definitions an admin accepted.

A tool seen for the first time is pinned as listed (the admin registering or
refreshing the server sees it). After that, a listing whose definition (name,
description, input schema) hashes differently disables the tool (`changed`) until
an admin accepts the new definition; a tool the server stops listing is `removed`;
one whose schema the host refuses is `invalid`. What the model sees and what may
be called is always the accepted definition.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from django.db import transaction
from django.utils import timezone

from controlplane.redaction import REDACTED
from runs.engine.validation import SchemaError, prepare_schema
from runs.mcp.endpoint import ListedTool, definition_sha256
from runs.models import McpServer, McpTool


@dataclass
class ListingChanges:
    """What a listing changed, by tool name (for the audit record and the API)."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, list[str]]:
        return {
            "added": sorted(self.added),
            "changed": sorted(self.changed),
            "removed": sorted(self.removed),
            "restored": sorted(self.restored),
            "invalid": sorted(self.invalid),
        }


# A description is context the model reads on every step: a longer one is refused.
MAX_DESCRIPTION_CHARS = 4000
# Shorter parts of a secret ("Bearer") are words, not the secret.
MIN_SECRET_CHARS = 8


def definition_problem(listed: ListedTool) -> str:
    """Why the host refuses a listed definition, or ""."""
    if listed.repeated_secret:
        return "its definition repeats the server's secret (taken out)"
    if len(listed.description) > MAX_DESCRIPTION_CHARS:
        return f"its description is longer than {MAX_DESCRIPTION_CHARS} characters"
    return schema_problem(listed.input_schema)


def without_secret(listed: ListedTool, secret: str) -> ListedTool:
    """The tool as listed, with `secret` (the value the server was sent, and
    each long word of it: a token after its "Bearer ") taken out of its
    description and schema, so it is neither stored nor shown to a model."""
    words = {secret, *(w for w in secret.split() if len(w) >= MIN_SECRET_CHARS)}
    words = {w for w in words if len(w) >= MIN_SECRET_CHARS}
    parts = [listed.description, listed.input_schema, listed.annotations]
    text = json.dumps(parts, ensure_ascii=False)
    escaped = [json.dumps(w, ensure_ascii=False)[1:-1] for w in words]
    if not any(w in text for w in escaped):
        return listed
    for word in sorted(escaped, key=len, reverse=True):
        text = text.replace(word, REDACTED)
    description, schema, annotations = json.loads(text)
    return replace(
        listed,
        description=description,
        input_schema=schema,
        annotations=annotations,
        definition_sha256=definition_sha256(listed.name, description, schema),
        repeated_secret=True,
    )


def schema_problem(schema: object) -> str:
    """Why the host refuses a tool's input schema, or ""."""
    if not isinstance(schema, dict):
        return "its input schema is not a JSON object"
    try:
        prepare_schema(schema)
    except SchemaError as exc:
        return f"its input schema is refused: {exc}"
    return ""


def _status_for(tool: McpTool) -> str:
    if tool.definition_sha256 != tool.accepted_sha256:
        return McpTool.Status.CHANGED
    if tool.problem:
        return McpTool.Status.INVALID
    return McpTool.Status.ACTIVE


@transaction.atomic
def mcp_listing_apply(
    *, server: McpServer, listing: list[ListedTool]
) -> ListingChanges:
    """Bring the server's tool rows in line with a fresh listing."""
    now = timezone.now()
    changes = ListingChanges()
    rows = {tool.name: tool for tool in McpTool.objects.select_for_update().filter(
        server=server
    )}  # fmt: skip
    for listed in listing:
        problem = definition_problem(listed)
        row = rows.pop(listed.name, None)
        if row is None:
            McpTool.objects.create(
                server=server,
                name=listed.name,
                description=listed.description,
                input_schema=listed.input_schema,
                annotations=listed.annotations,
                definition_sha256=listed.definition_sha256,
                accepted_sha256=listed.definition_sha256,
                accepted_description=listed.description,
                accepted_input_schema=listed.input_schema,
                accepted_at=now,
                problem=problem,
                status=McpTool.Status.INVALID if problem else McpTool.Status.ACTIVE,
                last_seen_at=now,
            )
            (changes.invalid if problem else changes.added).append(listed.name)
            continue
        before = row.status
        row.description = listed.description
        row.input_schema = listed.input_schema
        row.annotations = listed.annotations
        row.definition_sha256 = listed.definition_sha256
        if row.definition_sha256 == row.accepted_sha256:
            row.problem = problem
        row.last_seen_at = now
        row.status = _status_for(row)
        row.save()
        if row.status != before:
            if row.status == McpTool.Status.CHANGED:
                changes.changed.append(row.name)
            elif row.status == McpTool.Status.ACTIVE:
                changes.restored.append(row.name)
            elif row.status == McpTool.Status.INVALID:
                changes.invalid.append(row.name)
    for row in rows.values():
        if row.status != McpTool.Status.REMOVED:
            row.status = McpTool.Status.REMOVED
            row.save(update_fields=["status"])
            changes.removed.append(row.name)
    McpServer.objects.filter(id=server.id).update(
        last_refresh_at=now, last_refresh_status="ok", last_refresh_error=""
    )
    return changes
