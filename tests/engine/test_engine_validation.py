from __future__ import annotations

import pytest

from runs.engine.validation import (
    MAX_SCHEMA_DEPTH,
    SchemaError,
    prepare_schema,
    validate_arguments,
)

SCHEMA = prepare_schema(
    {
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "pattern": "^[0-9]{4}$"},
            "quantity": {"type": "integer", "minimum": 1},
            "address": {
                "type": "object",
                "properties": {"zip": {"type": "string"}},
                "required": ["zip"],
            },
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}},
                },
            },
        },
        "required": ["order_id"],
    }
)


def test_valid_arguments_have_no_errors() -> None:
    assert validate_arguments(SCHEMA, {"order_id": "4821", "quantity": 2}) == []


def test_missing_required_property_is_path_addressed() -> None:
    assert validate_arguments(SCHEMA, {}) == [
        "$.order_id: required property is missing"
    ]


def test_pattern_mismatch_names_the_field_and_pattern() -> None:
    errors = validate_arguments(SCHEMA, {"order_id": "#4821"})
    assert errors == ["$.order_id: '#4821' does not match '^[0-9]{4}$'"]


def test_extra_property_is_rejected_at_the_root() -> None:
    errors = validate_arguments(SCHEMA, {"order_id": "4821", "coupon": "FREE"})
    assert errors == ["$.coupon: unexpected property"]


def test_extra_property_is_rejected_in_nested_objects_and_arrays() -> None:
    errors = validate_arguments(
        SCHEMA,
        {
            "order_id": "4821",
            "address": {"zip": "1000", "note": "x"},
            "items": [{"sku": "K1"}, {"sku": "K2", "gift": True}],
        },
    )
    assert errors == [
        "$.address.note: unexpected property",
        "$.items[1].gift: unexpected property",
    ]


def test_schema_missing_additional_properties_is_closed_at_every_level() -> None:
    assert SCHEMA["additionalProperties"] is False
    assert SCHEMA["properties"]["address"]["additionalProperties"] is False
    assert SCHEMA["properties"]["items"]["items"]["additionalProperties"] is False


def test_schema_allowing_additional_properties_is_refused() -> None:
    with pytest.raises(SchemaError, match="additionalProperties: false"):
        prepare_schema(
            {"type": "object", "properties": {}, "additionalProperties": True}
        )


def test_float_with_zero_fraction_is_not_an_integer() -> None:
    errors = validate_arguments(SCHEMA, {"order_id": "4821", "quantity": 1.0})
    assert errors == ["$.quantity: expected integer, got number"]


def test_bool_is_not_an_integer() -> None:
    errors = validate_arguments(SCHEMA, {"order_id": "4821", "quantity": True})
    assert errors == ["$.quantity: expected integer, got boolean"]


def test_wrong_type_names_expected_and_actual() -> None:
    errors = validate_arguments(SCHEMA, {"order_id": 4821})
    assert errors == ["$.order_id: expected string, got integer"]


def test_arguments_must_be_an_object() -> None:
    assert validate_arguments(SCHEMA, ["4821"]) == ["$: expected object, got array"]


def test_remote_ref_is_refused() -> None:
    with pytest.raises(SchemaError, match="not local"):
        prepare_schema(
            {
                "type": "object",
                "properties": {"a": {"$ref": "https://evil.example/schema.json"}},
            }
        )


def test_local_ref_is_resolved() -> None:
    schema = prepare_schema(
        {
            "type": "object",
            "$defs": {"id": {"type": "string", "pattern": "^[0-9]+$"}},
            "properties": {"a": {"$ref": "#/$defs/id"}},
        }
    )
    assert validate_arguments(schema, {"a": "12"}) == []
    assert validate_arguments(schema, {"a": "x"}) == [
        "$.a: 'x' does not match '^[0-9]+$'"
    ]


def test_oversize_schema_is_refused() -> None:
    props = {
        f"field_{i}": {"type": "string", "description": "x" * 100} for i in range(800)
    }
    with pytest.raises(SchemaError, match="larger than"):
        prepare_schema({"type": "object", "properties": props})


def test_too_deep_schema_is_refused() -> None:
    inner: dict[str, object] = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH + 2):
        inner = {"type": "object", "properties": {"x": inner}}
    with pytest.raises(SchemaError, match="deeper than"):
        prepare_schema(inner)


def test_non_object_root_is_refused() -> None:
    with pytest.raises(SchemaError, match="type: object"):
        prepare_schema({"type": "string"})


def test_null_schema_is_refused() -> None:
    with pytest.raises(SchemaError, match="not null"):
        prepare_schema(None)  # type: ignore[arg-type]


def test_other_dialect_is_refused() -> None:
    with pytest.raises(SchemaError, match="2020-12"):
        prepare_schema(
            {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}
        )


def test_prepare_schema_does_not_mutate_the_input() -> None:
    original = {"type": "object", "properties": {"a": {"type": "string"}}}
    prepare_schema(original)
    assert "additionalProperties" not in original


def test_nullable_object_is_closed_too() -> None:
    schema = prepare_schema(
        {
            "type": "object",
            "properties": {
                "address": {
                    "type": ["object", "null"],
                    "properties": {"zip": {"type": "string"}},
                }
            },
        }
    )
    assert validate_arguments(schema, {"address": None}) == []
    assert validate_arguments(schema, {"address": {"zip": "1", "x": 2}}) == [
        "$.address.x: unexpected property"
    ]


def test_dangling_local_ref_is_refused_when_the_schema_is_prepared() -> None:
    with pytest.raises(SchemaError, match="points at nothing"):
        prepare_schema(
            {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
        )
