"""docker-compose.yml cannot be run here (no Docker engine), so check it against
the code: services, one image, commands that exist, variables the settings read."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml
from django.conf import settings
from django.core.management import get_commands
from django.utils.module_loading import import_string

BASE_DIR = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((BASE_DIR / "docker-compose.yml").read_text())
PYTHON_SERVICES = ("web", "worker", "beat")


def command_words(service: str) -> list[str]:
    command = COMPOSE["services"][service]["command"]
    return command if isinstance(command, list) else shlex.split(command)


def test_compose_has_the_five_services():
    assert set(COMPOSE["services"]) == {"postgres", "redis", "web", "worker", "beat"}


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


def test_web_command_migrates_then_serves_the_asgi_application():
    words = command_words("web")
    joined = " ".join(words)
    assert "manage.py migrate" in joined
    assert "migrate" in get_commands()
    target = re.search(r"daphne .* (\S+:\S+)", joined)
    assert target is not None
    module, attribute = target.group(1).split(":")
    assert import_string(f"{module}.{attribute}") is not None


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
