from __future__ import annotations

import sys
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from controlplane import secret_keys
from controlplane.demo import demo_seed, describe_logins
from controlplane.launcher import Launcher, install_stop_handlers


class Command(BaseCommand):
    help = (
        "Migrate, seed the demo, then start and supervise Daphne, a Celery worker, "
        "Celery beat and (with no REDIS_URL) an embedded Redis. Ctrl-C stops them all."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="Address to bind.")
        parser.add_argument("--port", type=int, default=settings.PORT)
        parser.add_argument("--concurrency", type=int, default=2, help="Worker pool.")

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write("Database migrated.")
        if not settings.SECRET_STORE_KEYS:
            # Made here, once, before web, worker and beat start and read it.
            secret_keys.active_keys()
            self.stdout.write(
                "Secret store: no CONTROLPLANE_SECRET_KEYS, using the development "
                f"key in {settings.SECRET_STORE_DEV_KEY_FILE} (docs/secrets.md)."
            )
        logins = describe_logins(demo_seed())
        if not settings.DEBUG:
            call_command("collectstatic", interactive=False, verbosity=0)
        launcher = Launcher(
            base_dir=settings.BASE_DIR,
            host=options["host"],
            port=options["port"],
            redis_url=settings.REDIS_URL,
            worker_concurrency=options["concurrency"],
            out=sys.stdout,
        )
        install_stop_handlers(launcher.request_stop)
        try:
            launcher.start()
            healthy, body = launcher.wait_healthy(timeout=120)
            url = f"http://{options['host']}:{options['port']}/"
            if healthy:
                self.stdout.write(
                    self.style.SUCCESS(
                        f"\nReady: {url}  log in with {logins}. "
                        "Ctrl-C stops everything.\n"
                    )
                )
            elif not launcher.stop_requested:
                self.stderr.write(f"Not healthy after 120 s at {url}healthz: {body}")
            launcher.run_until_stopped()
        finally:
            launcher.stop()
