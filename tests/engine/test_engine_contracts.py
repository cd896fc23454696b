from __future__ import annotations

import pytest

from runs.engine.contracts import (
    ContractError,
    Effect,
    Idempotency,
    ToolContract,
    ToolSource,
)

SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}},
    "required": ["order_id"],
}


def test_undeclared_facts_default_to_the_most_conservative() -> None:
    contract = ToolContract(
        name="mystery", description="Does something.", input_schema=SCHEMA
    )
    assert contract.effect is Effect.IRREVERSIBLE_EXTERNAL
    assert contract.idempotency is Idempotency.NONE
    assert contract.source is ToolSource.UNTRUSTED
    assert contract.auth_scope is None
    assert contract.is_read_only is False


def test_untrusted_tool_claiming_read_only_is_treated_as_external_write() -> None:
    contract = ToolContract(
        name="third_party",
        description="Claims to read.",
        input_schema=SCHEMA,
        effect=Effect.READ_ONLY,
    )
    assert contract.effective_effect is Effect.IRREVERSIBLE_EXTERNAL
    assert contract.is_read_only is False


def test_unknown_effect_in_a_declaration_falls_back_to_irreversible() -> None:
    contract = ToolContract.from_dict(
        {"name": "x", "description": "d", "input_schema": SCHEMA, "effect": "harmless"}
    )
    assert contract.effect is Effect.IRREVERSIBLE_EXTERNAL
    assert contract.idempotency is Idempotency.NONE
    assert contract.source is ToolSource.UNTRUSTED


def test_model_view_shows_only_name_description_and_schema() -> None:
    contract = ToolContract(
        name="refund",
        description="Refund a paid order.",
        input_schema=SCHEMA,
        preconditions=("order.status == 'paid'",),
        effect=Effect.IRREVERSIBLE_EXTERNAL,
        idempotency=Idempotency.REQUIRED_KEY,
        auth_scope="billing:refund",
        source=ToolSource.BUILTIN,
    )
    view = contract.model_view()
    assert view == {
        "type": "function",
        "function": {
            "name": "refund",
            "description": "Refund a paid order.",
            "parameters": {**SCHEMA, "additionalProperties": False},
            "strict": True,
        },
    }
    assert "billing" not in str(view)


def test_model_view_is_not_strict_when_a_property_is_optional() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    view = ToolContract(name="t", description="d", input_schema=schema).model_view()
    assert "strict" not in view["function"]


def test_contract_round_trips_through_a_dict() -> None:
    contract = ToolContract(
        name="refund",
        description="Refund.",
        input_schema=SCHEMA,
        preconditions=("amount_cents <= order.refundable_cents",),
        effect=Effect.IRREVERSIBLE_EXTERNAL,
        idempotency=Idempotency.REQUIRED_KEY,
        auth_scope="billing:refund",
        source=ToolSource.TRUSTED,
    )
    assert ToolContract.from_dict(contract.to_dict()) == contract


@pytest.mark.parametrize("name", ["billing.refund", "", "a" * 65, "has space"])
def test_tool_name_must_be_a_valid_function_name(name: str) -> None:
    with pytest.raises(ContractError):
        ToolContract(name=name, description="d", input_schema=SCHEMA)


def test_contract_requires_a_description() -> None:
    with pytest.raises(ContractError, match="description"):
        ToolContract(name="t", description="  ", input_schema=SCHEMA)


def test_model_view_is_not_strict_when_a_nested_property_is_optional() -> None:
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "string"},
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {"sku": {"type": "string"}}},
            },
        },
        "required": ["properties", "items"],
    }
    view = ToolContract(name="t", description="d", input_schema=schema).model_view()
    assert "strict" not in view["function"]
