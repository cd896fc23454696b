from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from controlplane import services
from controlplane.models import Tenant


class Command(BaseCommand):
    help = "Issue an API token for a user in a tenant and print it (shown only once)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--tenant", required=True, help="Tenant slug.")
        parser.add_argument("--user", required=True, help="Username.")
        parser.add_argument("--name", default="cli", help="A label for the token.")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant with slug {options['tenant']!r}.")
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"No user named {options['user']!r}.")
        try:
            issued = services.api_token_issue(
                tenant=tenant, user=user, name=options["name"]
            )
        except PermissionError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(issued.secret)
