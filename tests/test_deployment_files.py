"""docker-compose.yml cannot be run here (no Docker engine), so check it against
the code: services, one image, commands that exist, variables the settings read."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.core.management import get_commands
from django.urls import resolve
from django.utils.module_loading import import_string

from runs.sandbox.spec import SandboxSettings

BASE_DIR = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((BASE_DIR / "docker-compose.yml").read_text())
PYTHON_SERVICES = ("migrate", "web", "otlp", "worker", "beat")
LONG_RUNNING = ("web", "otlp", "worker", "beat")


def command_words(service: str) -> list[str]:
    command = COMPOSE["services"][service]["command"]
    return command if isinstance(command, list) else shlex.split(command)


def test_compose_has_the_seven_services():
    assert set(COMPOSE["services"]) == {
        "postgres", "redis", "migrate", "web", "otlp", "worker", "beat"
    }  # fmt: skip


def test_python_services_share_one_image_built_from_the_dockerfile():
    images = {COMPOSE["services"][name]["image"] for name in PYTHON_SERVICES}
    assert len(images) == 1
    for name in PYTHON_SERVICES:
        assert COMPOSE["services"][name]["build"] == "."
    assert (BASE_DIR / "Dockerfile").is_file()
    assert "bubblewrap" in (BASE_DIR / "Dockerfile").read_text()


def test_compose_environment_uses_only_variables_the_settings_read():
    for name in PYTHON_SERVICES:
        for variable in COMPOSE["services"][name]["environment"]:
            assert variable in settings.ENV_VARIABLES, variable


def test_compose_urls_point_at_the_compose_services():
    environment = COMPOSE["services"]["web"]["environment"]
    assert "@postgres:5432/" in environment["DATABASE_URL"]
    assert environment["REDIS_URL"].startswith("redis://redis:6379")
    postgres = COMPOSE["services"]["postgres"]["environment"]
    assert (
        f"{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}@"
        in (environment["DATABASE_URL"])
    )
    assert environment["DATABASE_URL"].endswith("/" + postgres["POSTGRES_DB"])


def test_the_postgresql_password_is_required_from_the_environment():
    password = COMPOSE["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert re.fullmatch(r"\$\{POSTGRES_PASSWORD:\?[^}]+\}", password), password
    url = COMPOSE["services"]["web"]["environment"]["DATABASE_URL"]
    assert re.search(r"controlplane:\$\{POSTGRES_PASSWORD:\?[^}]+\}@", url), url


def test_the_secret_store_keys_are_required_from_the_environment():
    for name in PYTHON_SERVICES:
        keys = COMPOSE["services"][name]["environment"]["CONTROLPLANE_SECRET_KEYS"]
        assert re.fullmatch(r"\$\{CONTROLPLANE_SECRET_KEYS:\?[^}]+\}", keys), keys


def test_migrate_is_a_one_shot_that_every_app_service_waits_for():
    migrate = COMPOSE["services"]["migrate"]
    words = command_words("migrate")
    assert re.search(r"exec python -m django migrate --noinput", " ".join(words))
    assert "migrate" in get_commands()
    assert migrate["restart"] == "no"
    assert "migrate" not in migrate["depends_on"]
    for name in LONG_RUNNING:
        depends = COMPOSE["services"][name]["depends_on"]
        assert depends["migrate"] == {"condition": "service_completed_successfully"}
        assert depends["postgres"] == {"condition": "service_healthy"}
        assert depends["redis"] == {"condition": "service_healthy"}
        assert "migrate" not in " ".join(command_words(name))


def test_web_execs_daphne_as_pid_1_serving_the_asgi_application():
    command = COMPOSE["services"]["web"]["command"]
    assert isinstance(command, list), "exec form: no shell between Docker and daphne"
    assert command[0] == "daphne"
    module, attribute = command[-1].split(":")
    assert import_string(f"{module}.{attribute}") is not None


def test_no_service_is_privileged_and_the_worker_gets_only_the_sandbox_grants():
    for name, service in COMPOSE["services"].items():
        assert not service.get("privileged"), name
    worker = COMPOSE["services"]["worker"]
    assert set(worker["cap_add"]) == {"SYS_ADMIN", "NET_ADMIN"}
    assert set(worker["security_opt"]) == {"seccomp=unconfined", "apparmor=unconfined"}
    assert worker["cgroup"] == "host"
    assert "/sys/fs/cgroup:/sys/fs/cgroup:rw" in worker["volumes"]
    for name in ("web", "otlp", "beat", "migrate"):
        assert "cap_add" not in COMPOSE["services"][name], name
        assert "security_opt" not in COMPOSE["services"][name], name
    # Each grant says what it is for.
    text = (BASE_DIR / "docker-compose.yml").read_text()
    for grant in ("SYS_ADMIN", "NET_ADMIN"):
        assert re.search(rf"- {grant}\s+#\s*\S", text), grant


def test_web_and_beat_run_unprivileged_and_the_worker_as_root():
    dockerfile = (BASE_DIR / "Dockerfile").read_text()
    assert re.search(r"useradd .*\bapp\b", dockerfile)
    assert re.search(r"^USER app$", dockerfile, re.MULTILINE)
    assert COMPOSE["services"]["web"]["user"] == "app"
    assert COMPOSE["services"]["beat"]["user"] == "app"
    assert COMPOSE["services"]["otlp"]["user"] == "app"
    assert COMPOSE["services"]["worker"]["user"] == "root"


def test_otlp_serves_grpc_on_every_interface_at_the_published_port():
    otlp = COMPOSE["services"]["otlp"]
    words = command_words("otlp")
    assert isinstance(otlp["command"], list), "exec form: the receiver is PID 1"
    assert words[:3] == ["python", "-m", "django"]
    assert words[3] == "otlp_grpc" and "otlp_grpc" in get_commands()
    environment = otlp["environment"]
    assert environment["OTLP_GRPC_BIND"] == "0.0.0.0"
    port = environment["OTLP_GRPC_PORT"]
    assert otlp["ports"] == [f"{port}:{port}"] and port == "4317"
    # It shares the app's environment (database, Redis, keys).
    assert (
        environment["DATABASE_URL"]
        == COMPOSE["services"]["web"]["environment"]["DATABASE_URL"]
    )
    check = " ".join(healthcheck_words("otlp"))
    assert f"('127.0.0.1', {port})" in check


def test_compose_sets_secure_cookies_for_its_plain_http_port():
    assert COMPOSE["services"]["web"]["ports"] == ["8000:8000"]
    for name in LONG_RUNNING:
        value = COMPOSE["services"][name]["environment"]["SECURE_COOKIES"]
        assert value == "${SECURE_COOKIES:-false}", name


def test_the_image_gives_the_sandbox_its_interpreter():
    dockerfile = (BASE_DIR / "Dockerfile").read_text()
    install = re.search(r"apt-get install[^&]*", dockerfile)
    assert install is not None
    for package in ("bubblewrap", "python3", "gcc", "libc6-dev"):
        assert re.search(rf"\b{package}\b", install.group(0)), package
    assert SandboxSettings().python == "/usr/bin/python3"  # Debian's python3


def test_healthchecks_run_commands_that_exist():
    for name, service in COMPOSE["services"].items():
        if "healthcheck" not in service or name not in PYTHON_SERVICES:
            continue
        test = service["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL"), name
        words = test[1:] if test[0] == "CMD" else shlex.split(test[1])
        executable = words[0]
        assert executable in ("python", "celery", "daphne"), (name, executable)
        assert shutil.which(executable, path=str(Path(sys.executable).parent))
        if executable == "python" and words[1] == "-c":
            compile(words[2], f"{name} healthcheck", "exec")
            for path in re.findall(r"http://127\.0\.0\.1:8000(/[^'\"]*)", words[2]):
                resolve(path)
        if executable == "python" and words[1] == "-m" and words[2] == "django":
            assert words[3] in get_commands(), (name, words[3])
        if executable == "celery":
            assert words[1:3] == ["-A", "controlplane"], name


def test_worker_and_beat_commands_name_the_celery_app():
    from controlplane.celery import app

    for name, verb in (("worker", "worker"), ("beat", "beat")):
        words = command_words(name)
        assert words[:3] == ["celery", "-A", "controlplane"]
        assert verb in words
    assert app.main == "controlplane"


def test_readme_lists_every_environment_variable():
    readme = (BASE_DIR / "README.md").read_text()
    missing = [name for name in settings.ENV_VARIABLES if f"`{name}`" not in readme]
    assert not missing, f"README.md does not document: {missing}"


def test_the_final_image_holds_the_installed_wheel_and_no_source_tree():
    dockerfile = (BASE_DIR / "Dockerfile").read_text()
    final = dockerfile.rsplit("\nFROM ", 1)[1]
    assert not re.search(r"^COPY \. ", final, re.MULTILINE), "source copied into /app"
    assert "COPY --from=wheel /wheels /wheels" in final
    assert re.search(r"pip install /wheels/\*\.whl", final)
    assert "manage.py" not in final
    for words in (command_words(name) for name in PYTHON_SERVICES):
        assert "manage.py" not in " ".join(words)


def healthcheck_words(service: str) -> list[str]:
    test = COMPOSE["services"][service]["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL"), test
    # Compose turns `$$` into a literal `$` for the container's shell.
    return [word.replace("$$", "$") for word in test]


def test_web_healthcheck_asks_readiness_not_a_worker():
    from django.urls import resolve

    from controlplane import health

    joined = " ".join(healthcheck_words("web"))
    url = re.search(r"http://127\.0\.0\.1:8000(/\S*?)'", joined)
    assert url is not None, joined
    assert resolve(url.group(1)).func is health.readyz


def _check_environment(**extra: str) -> dict[str, str]:
    from tests.conftest import database_url_for_subprocess

    environ = dict(os.environ)
    environ.update(
        DATABASE_URL=database_url_for_subprocess(),
        REDIS_URL=settings.REDIS_URL,
        CELERY_QUEUE=settings.CELERY_TASK_DEFAULT_QUEUE,
        # The image's `celery` and `python` are this environment's.
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        **extra,
    )
    return environ


def run_healthcheck(service: str, **env: str) -> subprocess.CompletedProcess[str]:
    words = healthcheck_words(service)
    command = ["sh", "-c", words[1]] if words[0] == "CMD-SHELL" else words[1:]
    if command[0] == "python":
        command[0] = sys.executable
    if command[0] == "celery":
        command[:1] = [sys.executable, "-m", "celery"]
    return subprocess.run(
        command, cwd=BASE_DIR, env=_check_environment(**env), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_worker_healthcheck_passes_while_its_node_answers_and_fails_after(tmp_path):
    from tests.conftest import start_worker

    hostname = f"wt-{uuid.uuid4().hex[:8]}"
    words = healthcheck_words("worker")
    # `celery -A controlplane inspect ping -d celery@$HOSTNAME`: its own node only.
    assert words[0] == "CMD-SHELL" and "celery@$HOSTNAME" in words[1]
    assert "inspect ping" in words[1]
    # With the worker command's default node name (celery@<hostname>).
    assert "-n" not in command_words("worker")
    worker = start_worker(tmp_path, name=f"celery@{hostname}")
    try:
        alive = run_healthcheck("worker", HOSTNAME=hostname)
        assert alive.returncode == 0, alive.stdout + alive.stderr
        other = run_healthcheck("worker", HOSTNAME=f"{hostname}-other")
        assert other.returncode != 0
    finally:
        worker.stop()
    gone = run_healthcheck("worker", HOSTNAME=hostname)
    assert gone.returncode != 0


def test_beat_healthcheck_follows_the_heartbeat_of_a_real_beat(tmp_path):
    from controlplane.beat import HEARTBEAT_MAX_AGE

    assert COMPOSE["services"]["beat"]["environment"]["BEAT_HEARTBEAT_FILE"]
    heartbeat = tmp_path / "beat-heartbeat"
    env = {"BEAT_HEARTBEAT_FILE": str(heartbeat)}
    never = run_healthcheck("beat", **env)
    assert never.returncode == 1 and "no heartbeat" in never.stderr
    with (tmp_path / "beat.log").open("wb") as sink:
        beat = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "beat",
             "-l", "INFO", "-s", str(tmp_path / "schedule")],
            cwd=BASE_DIR, env=_check_environment(**env), stdout=sink,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not heartbeat.exists():
            assert beat.poll() is None, (tmp_path / "beat.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "beat.log").read_text()
            time.sleep(0.2)
        ticking = run_healthcheck("beat", **env)
        assert ticking.returncode == 0, ticking.stderr
    finally:
        beat.terminate()
        beat.wait(30)
    # A beat that stopped turning: its last tick grows old.
    old = time.time() - HEARTBEAT_MAX_AGE - 5
    os.utime(heartbeat, (old, old))
    stale = run_healthcheck("beat", **env)
    assert stale.returncode == 1 and "last tick" in stale.stderr
    # Beat ticks well within the age the check allows.
    assert settings.CELERY_BEAT_MAX_LOOP_INTERVAL * 3 <= HEARTBEAT_MAX_AGE
