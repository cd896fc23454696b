"""A pytest plugin (`-p tests.metrics_dir` in pyproject's addopts) that gives the
test run one PROMETHEUS_MULTIPROC_DIR before anything imports prometheus-client.

It must run before pytest-django sets Django up: the admin's autodiscovery imports
every app's admin module, and those import services that record metrics. Set any
later (in a conftest), the metrics of this process would not be multiprocess and
GET /metrics would not add up the workers' (tests/runs/test_metrics.py)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# This process and every worker it starts record into one directory, and GET
# /metrics adds them up, as in compose.
# A pytest-xdist worker inherits its controller's environment: it takes a
# directory of its own, or GET /metrics would add up another worker's tests.
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get(
    "PYTEST_XDIST_WORKER"
):
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="cp-test-metrics-")
    atexit.register(shutil.rmtree, os.environ["PROMETHEUS_MULTIPROC_DIR"], True)
