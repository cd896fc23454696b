"""What the API accepts before a view sees it: JSON bodies of bounded nesting and
no NUL characters, validated query parameters, and bounded pages.

Python's decoder recurses once per nesting level (a deep enough document raises
RecursionError, a 500), and SQLite stores a NUL inside a string that PostgreSQL
refuses, so both are refused here, for every endpoint at once, with a 400 that
says which rule the body broke.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from itertools import accumulate, repeat
from operator import sub
from typing import Any

from django.conf import settings
from rest_framework import serializers
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.parsers import JSONParser
from rest_framework.request import Request

# Deepest JSON document a request body may be. Rule conditions, budget limits and
# tool arguments are a few levels deep; an attacker's are thousands.
API_JSON_MAX_DEPTH = 64

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
# Outside strings only brackets change the depth: keep them, as +1 (2) and -1 (0).
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
# A \u0000 escape, not an escaped backslash followed by "u0000".
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class JsonDocumentError(ValueError):
    """A JSON document the API refuses: malformed, nested too deep, or with a NUL."""


def json_nesting_depth(text: str) -> int:
    """How deep the arrays and objects of `text` nest, counted without decoding."""
    skeleton = (
        _JSON_STRING.sub("", text)
        .encode("utf-8", "replace")
        .translate(_BRACKET_STEPS, _NOT_BRACKETS)
    )
    return max(accumulate(map(sub, skeleton, repeat(1))), default=0)


def json_document_load(data: bytes | str, *, max_depth: int) -> Any:
    """Decode a JSON document whose nesting was checked first.

    Raises JsonDocumentError (a ValueError) naming what is wrong.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise JsonDocumentError(f"the body is not UTF-8: {exc}") from None
    depth = json_nesting_depth(text)
    if depth > max_depth:
        raise JsonDocumentError(
            f"the JSON document nests {depth} levels deep; at most {max_depth} "
            "are accepted"
        )
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise JsonDocumentError(
            "a string in the JSON document contains a NUL character (\\u0000); "
            "remove it"
        )
    try:
        return json.loads(text)
    except ValueError as exc:
        raise JsonDocumentError(f"the body is not valid JSON: {exc}") from None


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser, refusing deep nesting and NUL characters (400).

    The body's size is capped before it gets here: DRF reads JSON through
    `request.body`, which refuses more than DATA_UPLOAD_MAX_MEMORY_SIZE bytes
    (answered 413 by `controlplane.api_errors`).
    """

    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        try:
            return json_document_load(stream.read(), max_depth=API_JSON_MAX_DEPTH)
        except JsonDocumentError as exc:
            raise ParseError(str(exc)) from None


def query_params(
    request: Request, serializer_class: type[serializers.Serializer[Any]]
) -> dict[str, Any]:
    """The request's query parameters, validated by `serializer_class`.

    A bad value is a 400 naming the parameter (never a 500 from the ORM), and the
    same serializer documents the parameters: `extend_schema(parameters=[it])`.
    """
    checked = serializer_class(data=request.query_params)
    checked.is_valid(raise_exception=True)
    return dict(checked.validated_data)


def remote_addr(request: Request) -> str | None:
    """The caller's address as the audit log records it (None when unknown)."""
    return request.META.get("REMOTE_ADDR") or None


def reject_unknown_fields(request: Request, allowed: set[str]) -> None:
    """A JSON object body with no field outside `allowed` (a typo is a 400, not a
    silently ignored setting)."""
    if not isinstance(request.data, dict):
        raise ValidationError({"non_field_errors": ["the body must be a JSON object"]})
    unknown = sorted(set(request.data) - allowed)
    if unknown:
        raise ValidationError({name: ["unknown field"] for name in unknown})


class BoundedPagination(LimitOffsetPagination):
    """limit/offset paging that refuses what it cannot serve (400).

    DRF's own falls back to defaults for junk but passes a huge offset or limit to
    the database, which overflows (a 500 on SQLite and PostgreSQL alike). A limit
    above `max_limit` is served as `max_limit`, as DRF does (the pages' "more"
    buttons grow the limit); an offset is refused past 2**31 - 1.
    """

    max_limit = 1000
    max_offset = 2**31 - 1

    def get_limit(self, request: Request) -> int:
        value = self._integer(request, self.limit_query_param, minimum=1)
        return int(self.default_limit or 1) if value is None else value

    def get_offset(self, request: Request) -> int:
        value = self._integer(request, self.offset_query_param, minimum=0)
        if value is not None and value > self.max_offset:
            raise ValidationError(
                {self.offset_query_param: [f"at most {self.max_offset}"]}
            )
        return value or 0

    def _integer(self, request: Request, name: str, *, minimum: int) -> int | None:
        """The parameter as an int (None when absent); limits are capped here."""
        raw = request.query_params.get(name)
        if raw is None or raw == "":
            return None
        refusal = ValidationError({name: [f"an integer of at least {minimum}"]})
        if not (raw.isascii() and raw.isdigit()):
            raise refusal
        digits = raw.lstrip("0") or "0"
        # Past 20 digits both bounds are exceeded (and int() of thousands is slow).
        value = int(digits) if len(digits) <= 20 else 10**20
        if value < minimum:
            raise refusal
        if name == self.limit_query_param:
            return min(value, int(self.max_limit or value))
        return value

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.limit_query_param:
                parameter["schema"]["minimum"] = 1
                parameter["description"] = (
                    f"Results per page; above {self.max_limit}, {self.max_limit}."
                )
            else:
                parameter["schema"].update(minimum=0, maximum=self.max_offset)
        return parameters


def max_body_bytes() -> int:
    """The largest request body the API reads (API_MAX_BODY_BYTES)."""
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
