from __future__ import annotations

import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from runs.otlp.grpc_server import otlp_grpc_server


class Command(BaseCommand):
    help = (
        "Serve OTLP over gRPC (TraceService and LogsService Export) for agents "
        "instrumented elsewhere, authenticated by tenant API tokens "
        "(metadata 'authorization: Bearer <token>'). SIGTERM or Ctrl-C stops it, "
        "letting calls in progress finish."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--host", default=None, help="Address to bind (OTLP_GRPC_BIND)."
        )
        parser.add_argument(
            "--port", type=int, default=None, help="Port (OTLP_GRPC_PORT, 4317)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            server = otlp_grpc_server(host=options["host"], port=options["port"])
        except OSError as exc:
            raise CommandError(str(exc)) from exc
        host = options["host"] or settings.OTLP_GRPC_BIND
        self.stdout.write(
            f"OTLP/gRPC receiver listening on {host}:{server.port} "
            "(TraceService, LogsService)",
        )
        self.stdout.flush()
        stopping: list[int] = []

        def stop(signum: int, frame: object) -> None:
            # A flag only: a handler that takes a lock the interrupted main
            # thread may hold can deadlock (see controlplane/launcher.py).
            stopping.append(signum)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        while not stopping:
            # True: the wait timed out (still serving); False: it terminated.
            if not server.server.wait_for_termination(timeout=0.5):
                break
        # Calls in progress get the deadline to finish.
        server.stop(grace=settings.OTLP_GRPC_DEADLINE_SECONDS)
        self.stdout.write("OTLP/gRPC receiver stopped.")
