from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from controlplane.celery import app as celery_app
from controlplane.demo import (
    DEMO_MODEL_URL,
    DemoSeedError,
    demo_seed,
    demo_seed_through_api,
    describe_logins,
)
from controlplane.health import redis_status


class Command(BaseCommand):
    help = (
        "Create the demo tenant, its users and demo data (idempotent). With "
        "--with-mcp, also define the second agent through the API: a local "
        "OpenAI-compatible endpoint and an MCP stdio server in the sandbox."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--reset-password",
            action="store_true",
            help="Set a new password for the demo users (DEMO_PASSWORD or generated).",
        )
        parser.add_argument(
            "--with-mcp",
            action="store_true",
            help="Also seed the 'kettlecraft-warranty' agent (docs/demo.md).",
        )
        parser.add_argument(
            "--model-url",
            default=DEMO_MODEL_URL,
            help="Base URL of the demo's model server (make run starts one itself; "
            "otherwise: python -m runs.devserver --demo --port 8011).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        logins = demo_seed(reset_password=options["reset_password"])
        self.stdout.write(describe_logins(logins))
        if not options["with_mcp"]:
            return
        redis = redis_status()
        if redis != "ok":
            # The API's bearer authentication counts failed tokens in Redis.
            raise CommandError(
                f"The warranty agent is not seeded: no Redis at "
                f"{celery_app.conf.broker_url} ({redis}); start `make run` (which "
                "seeds it itself) or set REDIS_URL."
            )
        try:
            done = demo_seed_through_api(
                tenant=logins.tenant, model_url=options["model_url"]
            )
        except DemoSeedError as refused:
            raise CommandError(f"The warranty agent is not seeded: {refused}") from None
        self.stdout.write("\n".join(done))
