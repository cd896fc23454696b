"""What the processes tell operators: spans exported, metrics, logs."""

from __future__ import annotations

import os

from controlplane.environment import env

OTEL_SERVICE_NAME = env.string(
    "OTEL_SERVICE_NAME", "agent-control-plane", help="service.name of every span."
)
OTEL_EXPORTER_OTLP_ENDPOINT = env.string(
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "",
    help="OTLP/HTTP endpoint; when set, ended spans are also exported there.",
)

# Metrics (docs/architecture.md "Metrics"). prometheus-client reads the directory
# from the environment itself; it is declared here for the docs and the checks.
PROMETHEUS_MULTIPROC_DIR = env.string(
    "PROMETHEUS_MULTIPROC_DIR",
    "",
    help="Directory every process writes its metrics to (shared by web, worker "
    "and beat, emptied before they start); empty: this process's metrics only.",
)
if PROMETHEUS_MULTIPROC_DIR and not (
    os.path.isdir(PROMETHEUS_MULTIPROC_DIR)
    and os.access(PROMETHEUS_MULTIPROC_DIR, os.W_OK)
):
    env.problems.append(
        ("PROMETHEUS_MULTIPROC_DIR", "is not an existing, writable directory")
    )
    # The default instead (see environment.py): prometheus-client, which reads
    # the variable itself, would fail on its first metric rather than report.
    PROMETHEUS_MULTIPROC_DIR = ""
    del os.environ["PROMETHEUS_MULTIPROC_DIR"]
METRICS_TOKEN = env.string(
    "METRICS_TOKEN",
    "",
    help="Bearer token a scraper sends to GET /metrics; empty: staff sessions only.",
)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(name)s: %(message)s"}},
    # Every record is redacted (controlplane/redaction.py) before any handler writes it.
    "filters": {"redact": {"()": "controlplane.redaction.RedactingLogFilter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["redact"],
        }
    },
    "root": {
        "handlers": ["console"],
        "level": env.string("LOG_LEVEL", "INFO", help="Root log level."),
    },
}
