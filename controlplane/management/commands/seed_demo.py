from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from controlplane.demo import demo_seed, describe_logins


class Command(BaseCommand):
    help = "Create the demo tenant, its users and demo data (idempotent)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--reset-password",
            action="store_true",
            help="Set a new password for the demo users (DEMO_PASSWORD or generated).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        logins = demo_seed(reset_password=options["reset_password"])
        self.stdout.write(describe_logins(logins))
