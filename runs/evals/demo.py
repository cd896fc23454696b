"""The demo's evaluation suite (runs/demo_evals/kettlecraft.yaml) and the model
endpoint its LLM judge asks, seeded for the demo tenant."""

from __future__ import annotations

from pathlib import Path

from django.db import transaction

from controlplane.models import Tenant
from runs.models import EvalSuite, ModelEndpoint
from runs.services.agents import model_endpoint_create
from runs.services.evals import eval_suite_import

DEMO_SUITE_FILE = Path(__file__).resolve().parent.parent / "demo_evals/kettlecraft.yaml"
DEMO_JUDGE_ENDPOINT = "kettlecraft-judge"
# `python -m runs.devserver`'s default address: a local OpenAI-compatible model.
DEMO_JUDGE_URL = "http://127.0.0.1:8011/v1"


@transaction.atomic
def demo_seed_evals(
    *, tenant: Tenant, judge_base_url: str = DEMO_JUDGE_URL
) -> EvalSuite:
    """The Kettlecraft suite, as its file says, and its judge's endpoint (an
    OpenAI-compatible one at `judge_base_url`, made if the tenant has none)."""
    if not ModelEndpoint.objects.filter(
        tenant=tenant, slug=DEMO_JUDGE_ENDPOINT
    ).exists():
        model_endpoint_create(
            tenant=tenant,
            actor=None,
            data={
                "slug": DEMO_JUDGE_ENDPOINT,
                "name": "Demo judge (local)",
                "kind": ModelEndpoint.Kind.OPENAI,
                "base_url": judge_base_url,
                "options": {"max_retries": 0},
            },
        )
    suite, _ = eval_suite_import(
        tenant=tenant, actor=None, text=DEMO_SUITE_FILE.read_text("utf-8")
    )
    return suite
