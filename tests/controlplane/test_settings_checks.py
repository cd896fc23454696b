"""Misconfiguration is reported by system checks that name the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]


def run_check(**overrides: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in overrides}
    environ.update(overrides)
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=BASE_DIR,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_defaults_pass_the_checks():
    result = run_check()
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_debug_off_without_a_secret_store_key_is_an_error_with_a_hint():
    result = run_check(DEBUG="false", SECRET_KEY="k" * 50, CONTROLPLANE_SECRET_KEYS="")
    assert result.returncode != 0
    assert "controlplane.E010" in result.stderr
    assert "HINT: Set CONTROLPLANE_SECRET_KEYS" in result.stderr
    malformed = run_check(CONTROLPLANE_SECRET_KEYS="not-a-key")
    assert malformed.returncode != 0
    assert "key 1 of 1 in CONTROLPLANE_SECRET_KEYS is not a Fernet key" in (
        malformed.stderr
    )
    assert "not-a-key" not in malformed.stderr


def test_debug_off_with_the_dev_secret_key_is_an_error_with_a_hint():
    result = run_check(DEBUG="false", SECRET_KEY="")
    environ_key = run_check(DEBUG="false")
    for outcome in (result, environ_key):
        assert outcome.returncode != 0
        assert "controlplane.E002" in outcome.stderr
        assert "HINT: Set SECRET_KEY" in outcome.stderr


def test_malformed_values_fail_naming_the_variable():
    result = run_check(PORT="eighty", DEBUG="maybe", HEALTH_WORKER_TIMEOUT="nan")
    assert result.returncode != 0
    assert "controlplane.E001" in result.stderr
    for name in ("PORT", "DEBUG", "HEALTH_WORKER_TIMEOUT"):
        assert f"Environment variable {name}:" in result.stderr
    assert "Traceback" not in result.stderr


def test_unparseable_database_url_is_reported_not_raised():
    result = run_check(DATABASE_URL="nosuchscheme://x")
    assert result.returncode != 0
    assert "Environment variable DATABASE_URL" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_redis_is_reported_with_a_hint():
    from controlplane.embedded_redis import free_local_port

    result = run_check(REDIS_URL=f"redis://127.0.0.1:{free_local_port()}/0")
    assert "controlplane.W003" in result.stderr
    assert "Redis at REDIS_URL is not reachable" in result.stderr
    assert "HINT" in result.stderr


def test_a_model_deadline_not_below_the_lease_is_a_warning_with_a_hint():
    result = run_check(RUN_LEASE_SECONDS="30", RUN_MODEL_DEADLINE_SECONDS="45")
    assert result.returncode == 0, result.stderr
    assert "controlplane.W004" in result.stderr
    assert "RUN_MODEL_DEADLINE_SECONDS (45) is not below RUN_LEASE_SECONDS (30)" in (
        result.stderr
    )
    assert "HINT: A worker renews its lease" in result.stderr


def test_the_task_hard_time_limit_leaves_a_minute_beyond_the_model_deadline():
    def limits(**overrides: str) -> list[float]:
        environ = {k: v for k, v in os.environ.items() if k not in overrides}
        environ.update(overrides, DJANGO_SETTINGS_MODULE="controlplane.settings")
        printed = subprocess.run(
            [sys.executable, "-c", "from django.conf import settings as s; print("
             "s.RUN_LEASE_SECONDS, s.RUN_MODEL_DEADLINE_SECONDS, "
             "s.CELERY_TASK_TIME_LIMIT)"],
            cwd=BASE_DIR, env=environ, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert printed.returncode == 0, printed.stderr
        return [float(value) for value in printed.stdout.split()]

    lease, deadline, hard = limits()
    assert deadline < lease and hard == max(lease, deadline) + 60 == 180
    assert limits(RUN_MODEL_DEADLINE_SECONDS="150")[2] == 210


def test_a_missing_metrics_directory_is_reported_not_raised(tmp_path: Path) -> None:
    result = run_check(PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "missing"))
    assert result.returncode != 0
    assert "Environment variable PROMETHEUS_MULTIPROC_DIR:" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "missing").exists()
