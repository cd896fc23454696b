from __future__ import annotations

import socket
import sys
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from controlplane import secret_keys
from controlplane.demo import (
    DemoSeedError,
    demo_seed,
    demo_seed_through_api,
    describe_logins,
)
from controlplane.embedded_redis import free_local_port
from controlplane.launcher import Launcher, install_stop_handlers
from controlplane.models import Tenant


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on host:port (a bind would fail)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # As the receiver binds: a port left in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


class Command(BaseCommand):
    help = (
        "Migrate, seed the demo, then start and supervise Daphne, a Celery worker, "
        "Celery beat, the OTLP/gRPC receiver, (with no REDIS_URL) an embedded "
        "Redis and the demo's local model server. Ctrl-C stops them all."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="Address to bind.")
        parser.add_argument("--port", type=int, default=settings.PORT)
        parser.add_argument("--concurrency", type=int, default=2, help="Worker pool.")
        parser.add_argument(
            "--no-mcp-demo",
            action="store_true",
            help="Seed only the first demo agent; start no local model server.",
        )
        parser.add_argument(
            "--otlp-grpc-port",
            type=int,
            default=settings.OTLP_GRPC_PORT,
            help="Port of the OTLP/gRPC receiver (OTLP_GRPC_PORT, 4317); it binds "
            "the --host address.",
        )
        parser.add_argument(
            "--no-otlp-grpc",
            action="store_true",
            help="Start no OTLP/gRPC receiver (OTLP/HTTP on the web port stays).",
        )
        parser.add_argument(
            "--model-port",
            type=int,
            default=0,
            help="Loopback port of the demo's model server (0: a free one).",
        )

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
        seeded = demo_seed()
        logins = describe_logins(seeded)
        extra: list[tuple[str, list[str]]] = []
        grpc_port = options["otlp_grpc_port"]
        if not options["no_otlp_grpc"] and port_in_use(options["host"], grpc_port):
            # Often a local OpenTelemetry collector: the product comes up without
            # its gRPC receiver rather than not at all.
            self.stderr.write(
                f"OTLP/gRPC: {options['host']}:{grpc_port} is in use (another "
                "collector?); starting without the gRPC receiver. OTLP/HTTP is on "
                "the web port; set OTLP_GRPC_PORT or --otlp-grpc-port to use another."
            )
            options["no_otlp_grpc"] = True
        if not options["no_otlp_grpc"]:
            # A command of its own (gRPC is not HTTP/1.1: Daphne cannot serve it).
            argv = [sys.executable, "-m", "django", "otlp_grpc",
                    "--host", options["host"], "--port", str(grpc_port)]  # fmt: skip
            extra.append(("otlp", argv))
        model_port = options["model_port"] or free_local_port()
        if not options["no_mcp_demo"]:
            argv = [sys.executable, "-m", "runs.devserver", "--demo",
                    "--protocol", "openai", "--port", str(model_port)]  # fmt: skip
            extra.append(("model", argv))
        if not settings.DEBUG:
            call_command("collectstatic", interactive=False, verbosity=0)
        launcher = Launcher(
            base_dir=settings.BASE_DIR,
            host=options["host"],
            port=options["port"],
            redis_url=settings.REDIS_URL,
            worker_concurrency=options["concurrency"],
            out=sys.stdout,
            extra=extra,
        )
        install_stop_handlers(launcher.request_stop)
        agents = ["kettlecraft-support (scripted model, built-in tools)"]
        try:
            launcher.start()
            healthy, body = launcher.wait_healthy(timeout=120)
            url = f"http://{options['host']}:{options['port']}/"
            if (
                healthy
                and not options["no_mcp_demo"]
                and self._seed_warranty_agent(
                    seeded.tenant, api=url, model_port=model_port
                )
            ):
                agents.append(
                    "kettlecraft-warranty (local OpenAI-compatible model, MCP tool)"
                )
            if healthy:
                otlp = f"OTLP: {url}v1/traces and {url}v1/logs (HTTP)"
                if not options["no_otlp_grpc"]:
                    otlp += f", {options['host']}:{grpc_port} (gRPC)"
                self.stdout.write(
                    self.style.SUCCESS(
                        f"\nReady: {url}  log in with {logins}. "
                        f"Agents: {', '.join(agents)}. {otlp}, with a tenant API "
                        "token (manage.py issue_token). Ctrl-C stops everything.\n"
                    )
                )
            elif not launcher.stop_requested:
                self.stderr.write(f"Not healthy after 120 s at {url}healthz: {body}")
            launcher.run_until_stopped()
        finally:
            launcher.stop()

    def _seed_warranty_agent(
        self, tenant: Tenant, *, api: str, model_port: int
    ) -> bool:
        """Define the second demo agent through this server's own API, over HTTP
        (runs/demo_warranty.py says why then); False, saying why, if refused."""
        try:
            done = demo_seed_through_api(
                tenant=tenant,
                model_url=f"http://127.0.0.1:{model_port}/v1",
                # Bound to every address: reach it on loopback.
                api_url=api.replace("//0.0.0.0:", "//127.0.0.1:"),
            )
        except DemoSeedError as refused:
            self.stderr.write(
                "The second demo agent (kettlecraft-warranty) is not available: "
                f"{refused}\nThe first one is; `manage.py dev --no-mcp-demo` skips "
                "this step."
            )
            return False
        for line in done:
            self.stdout.write(f"Demo: {line}")
        return True
