"""Strict argument validation: JSON Schema Draft 2020-12 with host-side hardening.

The schema itself is untrusted input (spec §2.2): it is bounded in size and depth,
may only reference itself (`#/...`), and every object level is closed with
`additionalProperties: false`.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable

MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_SCHEMA_NODES = 2000
MAX_ERRORS = 20
MAX_MESSAGE_CHARS = 300

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"

# Keywords whose value is a map of name -> subschema.
_SCHEMA_MAPS = (
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
)
# Keywords whose value is one subschema.
_SCHEMA_VALUES = (
    "additionalProperties",
    "items",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
# Keywords whose value is a list of subschemas.
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")


class SchemaError(ValueError):
    """A tool's input schema is not acceptable to the host."""


def _is_integer(checker: object, instance: object) -> bool:
    # Exact integers: 1.0 is a float on the wire and is refused, bool is not an int.
    return isinstance(instance, int) and not isinstance(instance, bool)


def _is_number(checker: object, instance: object) -> bool:
    return isinstance(instance, int | float) and not isinstance(instance, bool)


_TYPE_CHECKER = Draft202012Validator.TYPE_CHECKER.redefine_many(
    {"integer": _is_integer, "number": _is_number}
)
StrictValidator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, type_checker=_TYPE_CHECKER
)


def _refuse_retrieval(uri: str) -> Any:
    # Never dereference network (or any non-local) URIs: that is an SSRF vector.
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


_LOCAL_ONLY_REGISTRY: Registry[Any] = Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]


def _resolve_pointer(root: Any, ref: str) -> bool:
    """Whether a `#/a/b` reference points at something inside `root`."""
    node = root
    for raw in ref[2:].split("/") if ref != "#/" else [""]:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False
    return True


def _collect_refs(schema: Any, refs: list[str]) -> None:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str):
                refs.append(value)
            else:
                _collect_refs(value, refs)
    elif isinstance(schema, list):
        for value in schema:
            _collect_refs(value, refs)


def _walk(schema: Any, depth: int, counter: list[int]) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaError(f"schema nested deeper than {MAX_SCHEMA_DEPTH} levels")
    if not isinstance(schema, dict):
        if isinstance(schema, bool):
            return
        raise SchemaError(f"subschema must be an object or boolean, got {schema!r}")
    counter[0] += 1
    if counter[0] > MAX_SCHEMA_NODES:
        raise SchemaError(f"schema has more than {MAX_SCHEMA_NODES} subschemas")
    for key in ("$ref", "$dynamicRef"):
        ref = schema.get(key)
        if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
            raise SchemaError(f"{key} {ref!r} is not local: only '#/...' is allowed")
    declared = schema.get("type")
    is_object = (
        declared == "object"
        or (isinstance(declared, list) and "object" in declared)
        or "properties" in schema
    )
    if is_object:
        extra = schema.get("additionalProperties", None)
        if extra is None:
            schema["additionalProperties"] = False
        elif extra is not False:
            raise SchemaError(
                "every object level must set additionalProperties: false, "
                f"got {extra!r}"
            )
    for key in _SCHEMA_MAPS:
        sub = schema.get(key)
        if isinstance(sub, dict):
            for value in sub.values():
                _walk(value, depth + 1, counter)
    for key in _SCHEMA_VALUES:
        if key in schema and key != "additionalProperties":
            _walk(schema[key], depth + 1, counter)
    for key in _SCHEMA_LISTS:
        sub = schema.get(key)
        if isinstance(sub, list):
            for value in sub:
                _walk(value, depth + 1, counter)


def prepare_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A checked, normalised copy of an input schema; raises `SchemaError`.

    Missing `additionalProperties` is set to `false` at every object level; any
    other value is refused. The root must be `type: object`.
    """
    if not isinstance(schema, Mapping):
        raise SchemaError("input_schema must be a JSON object, not null")
    try:
        encoded = json.dumps(schema)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"input_schema is not JSON: {exc}") from None
    if len(encoded.encode("utf-8")) > MAX_SCHEMA_BYTES:
        raise SchemaError(f"input_schema is larger than {MAX_SCHEMA_BYTES} bytes")
    prepared: dict[str, Any] = copy.deepcopy(dict(schema))
    dialect = prepared.get("$schema")
    if dialect is not None and dialect.rstrip("#") != DRAFT_2020_12:
        raise SchemaError(f"$schema must be {DRAFT_2020_12}, got {dialect!r}")
    if prepared.get("type") != "object":
        raise SchemaError("the root of input_schema must have type: object")
    _walk(prepared, 0, [0])
    refs: list[str] = []
    _collect_refs(prepared, refs)
    for ref in refs:
        if ref == "#" or not ref.startswith("#/") or "$id" in encoded:
            continue  # the root, an anchor, or relative to an embedded $id
        if not _resolve_pointer(prepared, ref):
            raise SchemaError(f"$ref {ref!r} points at nothing in the schema")
    try:
        StrictValidator.check_schema(prepared)
    except jsonschema.SchemaError as exc:
        raise SchemaError(f"invalid JSON Schema: {exc.message}") from None
    return prepared


def json_path(parts: Iterable[str | int]) -> str:
    """`$`, `$.order_id`, `$.items[0].sku` for an instance path."""
    out = "$"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


_JSON_TYPE_NAMES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
    type(None): "null",
}


def json_type_name(value: object) -> str:
    """The JSON type of a Python value (`1.0` is a number, `True` a boolean)."""
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


# Errors about a value's form, which a field's description can explain.
_HINTED = frozenset({"pattern", "format", "enum", "minLength", "maxLength"})


def _clip(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 3] + "..."


def _messages_for(error: ValidationError) -> list[str]:
    path = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        value = error.validator_value
        required = value if isinstance(value, list) else []
        return [
            f"{json_path([*path, name])}: required property is missing"
            for name in required
            if name not in error.instance
        ]
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        schema = error.schema if isinstance(error.schema, dict) else {}
        known = set(schema.get("properties", {}))
        patterns = list(schema.get("patternProperties", {}))
        extras = [
            key
            for key in error.instance
            if key not in known and not any(re.search(p, key) for p in patterns)
        ]
        return [f"{json_path([*path, key])}: unexpected property" for key in extras]
    if error.validator == "type":
        expected = error.validator_value
        wanted = " or ".join(expected) if isinstance(expected, list) else expected
        return [
            f"{json_path(path)}: expected {wanted}, "
            f"got {json_type_name(error.instance)}"
        ]
    message = f"{json_path(path)}: {error.message}"
    schema = error.schema if isinstance(error.schema, dict) else {}
    hint = schema.get("description")
    if error.validator in _HINTED and isinstance(hint, str) and hint:
        # The field's own description says what is expected ("Order number
        # without '#'"), which makes the error actionable (spec §2.1 ch. 3).
        message = f"{message}; expected: {hint}"
    return [_clip(message)]


def validate_arguments(schema: Mapping[str, Any], arguments: object) -> list[str]:
    """Path-addressed error messages for `arguments`; empty when they are valid.

    `schema` must have been through `prepare_schema`.
    """
    if not isinstance(arguments, dict):
        return [f"$: expected object, got {json_type_name(arguments)}"]
    validator = StrictValidator(schema, registry=_LOCAL_ONLY_REGISTRY)
    messages: list[str] = []
    try:
        errors = sorted(
            validator.iter_errors(arguments),
            key=lambda e: [str(p) for p in e.absolute_path],
        )
    except Unresolvable as exc:
        return [f"$: the tool's schema has an unresolvable reference {exc.ref!r}"]
    for error in errors:
        for message in _messages_for(error):
            if message not in messages:
                messages.append(message)
        if len(messages) >= MAX_ERRORS:
            break
    return messages[:MAX_ERRORS]
