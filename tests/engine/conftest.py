"""Fixtures for engine tests."""

from __future__ import annotations

import pytest

from runs.engine.tools import Tool, ToolRegistry
from tests.engine.fakes import Shop, read_only_contract, write_contract


@pytest.fixture
def shop() -> Shop:
    return Shop()


@pytest.fixture
def registry(shop: Shop) -> ToolRegistry:
    return ToolRegistry(
        [
            Tool(read_only_contract(), shop.lookup_order, timeout_seconds=None),
            Tool(write_contract(), shop.create_replacement, timeout_seconds=None),
        ]
    )
