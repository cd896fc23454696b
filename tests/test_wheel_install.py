"""The image's file tree without a Docker engine: build the wheel from a copy of the
build context (.dockerignore applied), install it into a clean virtualenv outside the
checkout as the Dockerfile does, and run the product from there."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import uuid
from pathlib import Path

import pytest
from django.conf import settings

BASE_DIR = Path(__file__).resolve().parent.parent

SMOKE = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path

    import django
    django.setup()

    import approvals, controlplane, frontend, runs, tracing
    from django.contrib.auth import get_user_model
    from django.test import Client

    from approvals.models import ApprovalRequest
    from runs.services.decide import approval_decide
    from controlplane.models import Tenant
    from runs.demo import DEMO_AGENT_SLUG, DEMO_INPUT
    from runs.models import Run
    from runs.sandbox import init_install
    from runs.sandbox.spec import SandboxSettings
    from runs.services import run_advance, run_start

    report = {"modules": [m.__file__ for m in
                          (approvals, controlplane, frontend, runs, tracing)]}
    report["c_sources"] = [str(p) for p in
                           Path(init_install.__file__).parent.glob("*.c")]

    client = Client()
    page = client.get("/login/")
    report["login"] = [page.status_code, b"<form" in page.content]
    admin = get_user_model().objects.get(username="admin")
    client.force_login(admin)
    page = client.get("/runs/")
    report["runs_page"] = [page.status_code, b"runs_page.js" in page.content]

    state = Path(sys.argv[1])
    config = SandboxSettings(workspace_root=state / "ws", state_dir=state / "st")
    report["launcher"] = str(init_install.install_launcher(config))
    report["init"] = init_install.install_init(config).kind

    tenant = Tenant.objects.get(agents__slug=DEMO_AGENT_SLUG)
    run = run_start(tenant=tenant, agent_slug=DEMO_AGENT_SLUG, input=DEMO_INPUT,
                    started_by=None)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.is_terminal:
            break
        if run.status == Run.Status.WAITING_APPROVAL:
            request = ApprovalRequest.objects.get(run=run, status="pending")
            approval_decide(request=request, decided_by=admin, approve=True)
            continue
        run_advance(run_id=str(run.id), step_token=str(run.step_token), owner="smoke")
    report["run"] = [run.status, run.final_answer]
    print("REPORT " + json.dumps(report))
    """
)


def _ignored(patterns: list[str]):  # type: ignore[no-untyped-def]
    """.dockerignore's rules: patterns match paths from the context's root, and a
    leading `**/` matches at any depth, the root included."""

    def matches(path: str, pattern: str) -> bool:
        bare = pattern.removeprefix("**/")
        return fnmatch.fnmatch(path, pattern) or (
            bare != pattern and fnmatch.fnmatch(path, bare)
        )

    def ignore(directory: str, names: list[str]) -> set[str]:
        rel = Path(directory).relative_to(BASE_DIR)
        return {
            name
            for name in names
            if any(matches(str(rel / name), pattern) for pattern in patterns)
        }

    return ignore


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding only the wheel; its dependencies come from the project venv
    through a path entry (the project's own editable install is not processed)."""
    root = tmp_path_factory.mktemp("wheel-install")
    patterns = [
        line.strip()
        for line in (BASE_DIR / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    context = root / "context"
    shutil.copytree(BASE_DIR, context, ignore=_ignored(patterns))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    # The build backend comes from the project venv (a dev requirement): an
    # isolated build would fetch setuptools from the index, and a slow index
    # once held CI to its deadline.
    subprocess.run(
        [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(root / "wheels"), str(context)],
        check=True, capture_output=True, cwd=root, timeout=300,
    )  # fmt: skip
    venv = root / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True
    )
    (wheel,) = (root / "wheels").glob("*.whl")
    subprocess.run(
        [*pip, "--python", str(venv / "bin" / "python"), "install", "-q",
         "--no-deps", "--no-index", str(wheel)],
        check=True, capture_output=True, cwd=root, timeout=300,
    )  # fmt: skip
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c",
             "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )  # fmt: skip
    (site / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _run(venv: Path, root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    environ = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(root),
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "DEBUG": "false",
        "SECRET_KEY": "wheel-smoke-" + "k" * 50,
        "CONTROLPLANE_SECRET_KEYS": settings.SECRET_STORE_KEYS[0],
        "ALLOWED_HOSTS": "testserver",
        "SECURE_COOKIES": "false",
        "DATABASE_URL": f"sqlite:///{root / 'db.sqlite3'}",
        "REDIS_URL": settings.REDIS_URL,
        # A queue no worker listens on: the smoke advances its run inline.
        "CELERY_QUEUE": f"wheel-smoke-{uuid.uuid4().hex[:8]}",
        "STATIC_ROOT": str(root / "static"),
        "SANDBOX_ROOT": str(root / "sandbox"),
        "DEMO_PASSWORD": "wheel-smoke-password",
    }
    # -I: neither the working directory nor PYTHONPATH reaches sys.path.
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-I", *argv],
        cwd=root, env=environ, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, f"{argv}: {proc.stdout}\n{proc.stderr}"
    return proc


def test_the_installed_wheel_runs_without_the_checkout(
    installed: Path, tmp_path: Path
) -> None:
    os.chmod(tmp_path, 0o711)  # the sandbox root must be traversable by uid 65534
    for command in ("check", "migrate", "collectstatic", "seed_demo"):
        _run(installed, tmp_path, "-m", "django", command, *(
            ["--noinput"] if command in ("migrate", "collectstatic") else []
        ))  # fmt: skip
    assert (tmp_path / "static" / "frontend" / "run_page.js").is_file()
    assert (tmp_path / "static" / "admin").is_dir()

    script = tmp_path / "smoke.py"
    script.write_text(SMOKE)
    proc = _run(installed, tmp_path, str(script), str(tmp_path / "sandbox-state"))
    line = next(x for x in proc.stdout.splitlines() if x.startswith("REPORT "))
    report = json.loads(line.removeprefix("REPORT "))

    # The code came from the wheel, not from the checkout.
    for path in [*report["modules"], *report["c_sources"]]:
        assert Path(path).is_relative_to(installed), path
        assert not Path(path).is_relative_to(BASE_DIR), path
    assert {Path(p).name for p in report["c_sources"]} == {
        "sandbox_init.c",
        "sandbox_launch.c",
    }
    assert report["login"] == [200, True]
    assert report["runs_page"] == [200, True]
    assert report["launcher"].startswith(str(tmp_path / "sandbox-state"))
    assert report["init"] == "c"
    status, answer = report["run"]
    assert status == "succeeded", report
    assert "replacement kettle is on its way" in answer
