"""`GET /api/v1/runs/<id>/session/`: a run's session log, a page of entries at a
time (`after_seq`/`limit`, as the run events API pages), and as `messages` the
context its leaf (or another entry, `?leaf=`) rebuilds to from the whole log
(docs/engine.md)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import APIException, NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_input import query_params
from controlplane.api_schema import ErrorSerializer
from controlplane.permissions import Action, Gate
from controlplane.redaction import RedactedJSONField
from controlplane.tenancy import tenant_of
from runs import selectors
from runs.engine.session import SessionEntry as Entry
from runs.engine.session import SessionLogError, build_context
from runs.models import SessionEntry

# Entries per page: a long run logs 10,000 and more.
SESSION_PAGE_DEFAULT = 500
SESSION_PAGE_MAX = 1000
# A seq is a PostgreSQL bigint; a larger cursor would overflow the query (a 500).
SEQ_MAX = 2**63 - 1


class Conflict(APIException):
    status_code = 409
    default_code = "conflict"


class SessionEntrySerializer(serializers.Serializer[Any]):
    seq = serializers.IntegerField()
    # The run (branch) that wrote it: a branched session's tree spans runs.
    run = serializers.UUIDField(source="run_id")
    id = serializers.CharField(source="entry_id")
    parentId = serializers.SerializerMethodField()  # noqa: N815 - the spec's name
    type = serializers.CharField()
    payload = RedactedJSONField()
    created_at = serializers.DateTimeField()

    def get_parentId(self, entry: SessionEntry) -> str | None:  # noqa: N802
        return entry.parent_id or None


class RunSessionSerializer(serializers.Serializer[Any]):
    run = serializers.UUIDField()
    leaf = serializers.CharField(allow_null=True)
    # The branch the context is rebuilt from: `leaf` unless the query names one.
    context_leaf = serializers.CharField(allow_null=True)
    # Entries in the whole log (every page), and the page's entries in seq
    # order: the whole tree's, branches interleaved by seq.
    count = serializers.IntegerField()
    entries = SessionEntrySerializer(many=True)
    # `after_seq` for the next page; null on the last.
    next_after_seq = serializers.IntegerField(allow_null=True)
    # Rebuilt from the whole log, the same on every page.
    messages = RedactedJSONField()


class SessionQuerySerializer(serializers.Serializer[Any]):
    leaf = serializers.RegexField(
        r"^[0-9a-f]{8}$",
        required=False,
        help_text="rebuild the context from this entry (8 hex digits) instead "
        "of the current leaf",
    )
    after_seq = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=SEQ_MAX,
        help_text="entries after this seq (the last page's `next_after_seq`); "
        "absent: from the first",
    )
    limit = serializers.IntegerField(
        required=False,
        default=SESSION_PAGE_DEFAULT,
        min_value=1,
        max_value=SESSION_PAGE_MAX,
        help_text=f"entries per page, at most {SESSION_PAGE_MAX}",
    )


class RunSessionApi(APIView):
    gate: Gate = {"GET": Action.RUN_READ}

    @extend_schema(
        parameters=[SessionQuerySerializer],
        responses={200: RunSessionSerializer, 409: ErrorSerializer},
    )
    def get(self, request: Request, run_id: str) -> Response:
        query = query_params(request, SessionQuerySerializer)
        session = selectors.run_session_for(
            tenant=tenant_of(request).tenant, run_id=run_id
        )
        if session is None:
            raise NotFound("No such run in this tenant.")
        rows = list(session.entries)
        entries = {
            row.entry_id: Entry(
                row.seq, row.entry_id, row.parent_id or None, row.type, row.payload
            )
            for row in rows
        }
        leaf = query.get("leaf", session.leaf)
        if leaf is not None and leaf not in entries:
            raise ValidationError({"leaf": [f"no entry {leaf} in this run's log"]})
        try:
            messages = build_context(entries, leaf) if leaf else []
        except SessionLogError as exc:
            # A branch whose source run was deleted (by hand or by retention)
            # lost the start of its path; its own entries are still listed.
            raise Conflict(f"the log cannot be rebuilt: {exc}") from exc
        page, next_after_seq = selectors.session_entries_page(
            session=session, after_seq=query.get("after_seq"), limit=query["limit"]
        )
        body = {
            "run": session.run_id,
            "leaf": session.leaf,
            "context_leaf": leaf,
            "count": len(rows),
            "entries": page,
            "next_after_seq": next_after_seq,
            "messages": messages,
        }
        return Response(RunSessionSerializer(body).data)
