"""`python -m soak` (`make soak`): see docs/soak.md.

Exit status: 0 when every target was met, 1 when one was missed (each named),
2 for bad options, 3 when the topology could not be started or cleaned up.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import django
from django.core.management import call_command

from soak.topology import Topology, TopologyError, tagged_processes

FAULTS = (
    "worker-kill",
    "child-kill",
    "redis-restart",
    "postgres-restart",
    "daphne-restart",
)
CHOICES = ("none", *FAULTS)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m soak",
        description="Start the production topology, drive demo runs with approvals "
        "and WebSocket clients, inject faults one at a time, check the database.",
    )
    parser.add_argument("--runs-per-fault", type=int, default=300, metavar="N")
    parser.add_argument(
        "--clients", type=int, default=20, metavar="M",
        help="WebSocket clients per phase, each following one run (default 20)",
    )  # fmt: skip
    parser.add_argument(
        "--faults", default=",".join(FAULTS),
        help=f"comma-separated, run in this order; one of: {', '.join(CHOICES)} "
        "(none: a phase without a fault). Default: every fault",
    )  # fmt: skip
    parser.add_argument(
        "--rate", type=float, default=5.0,
        help="runs asked for per second (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--deny-every", type=int, default=5, metavar="K",
        help="deny the approval of every K-th run, approve the others (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--outage", type=float, default=2.0, metavar="SECONDS",
        help="how long Redis and PostgreSQL stay down when restarted (default 2)",
    )  # fmt: skip
    parser.add_argument(
        "--settle-timeout", type=float, default=400.0, metavar="SECONDS",
        help="after the fault, how long runs may take to end before they count "
        "as lost (default 400: more than the 120 s lease and its sweep)",
    )  # fmt: skip
    parser.add_argument(
        "--keep", action="store_true",
        help="keep the working directory (logs, database files) after stopping",
    )  # fmt: skip
    args = parser.parse_args(argv)
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [f for f in faults if f not in CHOICES]
    if unknown or not faults:
        parser.error(
            f"unknown fault(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(CHOICES)}"
        )
    if args.runs_per_fault < 1 or args.clients < 0 or args.rate <= 0:
        parser.error("--runs-per-fault must be >= 1, --clients >= 0, --rate > 0")
    args.fault_list = faults
    return args


def issue_token(user: str) -> str:
    out = io.StringIO()
    call_command("issue_token", tenant="kettlecraft", user=user, stdout=out)
    return out.getvalue().strip()


STARTED = time.monotonic()


def say(line: str) -> None:
    """Progress lines carry the seconds since the harness started."""
    if line and not line.startswith(("|", " ", "\n")):
        line = f"[{time.monotonic() - STARTED:6.1f}] {line}"
    print(line, flush=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str]) -> int:
    args = parse(argv)
    # Explicitly for SIGINT too: started from a background job, the harness
    # inherits SIGINT ignored, and Ctrl-C (or a test's SIGINT) would not stop it.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    topology = Topology(keep=args.keep, say=say)
    say(f"soak: working directory {topology.workdir} (run id {topology.run_id})")
    status = 0
    soak = None
    try:
        topology.start_stores()
        # The harness migrates, seeds and checks the same database the services
        # use: Django is set up only now, once the topology's URLs exist.
        os.environ.update(
            {k: v for k, v in topology.environment().items() if k != "SOAK_RUN_ID"}
        )
        os.environ["LOG_LEVEL"] = "WARNING"
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
        django.setup()
        call_command("migrate", interactive=False, verbosity=0)
        call_command("seed_demo", stdout=io.StringIO())
        operator, admin = (issue_token(user) for user in ("operator", "admin"))
        say("migrated, seeded the demo, issued an operator's and an admin's token")
        topology.start_services()
        harness = importlib.import_module("soak.harness")
        soak = harness.Soak(
            topology, args, operator_token=operator, admin_token=admin, say=say
        )
        results = []
        for fault in args.fault_list:
            say(f"phase {fault}: {args.runs_per_fault} runs, {args.clients} clients")
            started = time.monotonic()
            results.extend(soak.run([fault]))
            say(f"phase {fault} done in {time.monotonic() - started:.0f} s")
        checks = importlib.import_module("soak.checks")
        say("")
        say(checks.table(results))
        for result in results:
            if result.fault_note:
                say(
                    f"\n{result.fault}: {result.fault_note}; "
                    f"{result.in_flight} in flight"
                )
            elif result.details:
                say(f"\n{result.fault}:")
            for detail in result.details:
                say(f"  - {detail}")
        missed = [m for r in results for m in r.missed()]
        if missed:
            say("\ntargets missed:")
            for line in missed:
                say(f"  - {line}")
            status = 1
        else:
            say("\nevery target met")
    except KeyboardInterrupt:
        say("soak: interrupted; stopping what it started")
        status = 130
    except TopologyError as exc:
        say(f"soak: {exc}")
        status = 3
    finally:
        if soak is not None:
            soak.close()
        say("soak: stopping")
        topology.stop()
        left = tagged_processes(topology.run_id, str(topology.workdir))
        if left:
            say(f"soak: processes left running: {left}")
            status = 3
        elif args.keep:
            say(f"soak: stopped every process; kept {topology.workdir}")
        elif Path(topology.workdir).exists():
            say(f"soak: could not remove {topology.workdir}")
            status = 3
        else:
            say("soak: stopped every process and removed the working directory")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
