from __future__ import annotations

from typing import Any

import pytest

from runs.demo import DEMO_AGENT_SLUG, demo_seed_shop
from runs.models import Agent


@pytest.fixture
def demo_agent(tenant: Any) -> Agent:
    demo_seed_shop(tenant=tenant)
    return Agent.objects.get(tenant=tenant, slug=DEMO_AGENT_SLUG)
