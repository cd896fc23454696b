"""The demo's evaluation suite (runs/demo_evals/kettlecraft.yaml) and the model
endpoint its LLM judge asks, seeded for the demo tenant.

`make run` and `seed_demo --with-mcp` seed them through the API as the demo
admin (settings.DEMO_API_SEEDERS), like the warranty agent: the judge endpoint
`kettlecraft-judge` points at the local model server they start
(`python -m runs.devserver --demo`), which answers the judge's model,
`scripted-judge`, with the scripted judge (runs/devserver/judge.py), so the
suite runs with no API key. Only what is missing or different is written: a
suite already there is left as it is (a person may have edited it; importing the
file resets it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from django.db import transaction

from controlplane.demo import DEMO_MODEL_URL
from controlplane.models import Tenant
from runs.demo_warranty import DemoApi, demo_admin_api
from runs.devserver.demo import DEMO_JUDGE_MODEL
from runs.models import EvalSuite, ModelEndpoint
from runs.services.agents import model_endpoint_create
from runs.services.evals import eval_suite_import

DEMO_SUITE_FILE = Path(__file__).resolve().parent.parent / "demo_evals/kettlecraft.yaml"
DEMO_SUITE_SLUG = "kettlecraft"
DEMO_JUDGE_ENDPOINT = "kettlecraft-judge"
# `python -m runs.devserver`'s default address: a local OpenAI-compatible model.
DEMO_JUDGE_URL = DEMO_MODEL_URL

__all__ = [
    "DEMO_JUDGE_ENDPOINT",
    "DEMO_JUDGE_MODEL",
    "DEMO_SUITE_FILE",
    "DEMO_SUITE_SLUG",
    "demo_seed_evals",
    "demo_seed_evals_through_api",
]


def _judge_endpoint(base_url: str) -> dict[str, object]:
    return {
        "slug": DEMO_JUDGE_ENDPOINT,
        "name": "Demo judge (local scripted judge)",
        "kind": ModelEndpoint.Kind.OPENAI.value,
        "base_url": base_url,
        "api_key_secret": "",
        # A judge answers in one call: a down server is reported, not retried.
        "options": {"max_retries": 0, "timeout_seconds": 30},
    }


@transaction.atomic
def demo_seed_evals(
    *, tenant: Tenant, judge_base_url: str = DEMO_JUDGE_URL
) -> EvalSuite:
    """In-process: the Kettlecraft suite, as its file says, and its judge's
    endpoint (made if the tenant has none)."""
    if not ModelEndpoint.objects.filter(
        tenant=tenant, slug=DEMO_JUDGE_ENDPOINT
    ).exists():
        model_endpoint_create(
            tenant=tenant, actor=None, data=_judge_endpoint(judge_base_url)
        )
    suite, _ = eval_suite_import(
        tenant=tenant, actor=None, text=DEMO_SUITE_FILE.read_text("utf-8")
    )
    return suite


@dataclass
class EvalSeedReport:
    model_url: str = ""
    changes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        done = "; ".join(self.changes) if self.changes else "already up to date"
        return (
            f"eval suite {DEMO_SUITE_SLUG} (judge endpoint {DEMO_JUDGE_ENDPOINT} "
            f"at {self.model_url}, model {DEMO_JUDGE_MODEL}): {done}"
        )


def _seed_judge(api: DemoApi, report: EvalSeedReport) -> None:
    wanted = _judge_endpoint(report.model_url)
    found = [
        e for e in api.call("GET", "model-endpoints/") if e["slug"] == wanted["slug"]
    ]
    if not found:
        api.call("POST", "model-endpoints/", wanted)
        report.changes.append(f"model endpoint {DEMO_JUDGE_ENDPOINT} created")
    elif any(found[0].get(key) != value for key, value in wanted.items()):
        api.call("PUT", f"model-endpoints/{found[0]['id']}/", wanted)
        report.changes.append(f"model endpoint {DEMO_JUDGE_ENDPOINT} updated")


def _seed_suite(api: DemoApi, report: EvalSeedReport) -> None:
    suites = api.call("GET", "evals/suites/")
    if any(s["slug"] == DEMO_SUITE_SLUG for s in suites):
        return
    api.call(
        "POST", "evals/suites/import/", {"yaml": DEMO_SUITE_FILE.read_text("utf-8")}
    )
    report.changes.append(f"eval suite {DEMO_SUITE_SLUG} imported")


def demo_seed_evals_through_api(
    *, tenant: Tenant, model_url: str = DEMO_MODEL_URL, api_url: str = ""
) -> EvalSeedReport:
    """The judge's endpoint (at `model_url`, the demo's model server) and the
    suite, through the API as the demo admin: over HTTP at `api_url`, or with
    none in-process."""
    report = EvalSeedReport(model_url=model_url)
    with demo_admin_api(tenant, api_url) as api:
        _seed_judge(api, report)
        _seed_suite(api, report)
    return report
