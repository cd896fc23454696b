from __future__ import annotations

import json
import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from controlplane.celery import app as celery_app
from controlplane.health import redis_status, worker_status
from controlplane.models import Tenant
from runs.models import Agent, Run, Step
from runs.services import RunInputError, run_advance, run_start


def describe_step(step: Step) -> str:
    calls = list(step.tool_calls.order_by("position"))
    if not calls:
        kind = step.action.get("type", "")
        if kind == "final_answer":
            return f"final answer: {step.action.get('text', '')[:200]}"
        return f"{kind}: {step.action.get('reason', '')}"
    parts = []
    for call in calls:
        args = json.dumps(call.args, separators=(",", ":"))[:120]
        parts.append(f"{call.tool_name}({args}) → {call.status}")
    return "; ".join(parts)


class Command(BaseCommand):
    help = (
        "Start a run of an agent. With --wait, print one line per step as workers "
        "advance it and exit 0 only if it succeeded; --inline advances it in this "
        "process instead of a worker."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("agent", help="Agent slug.")
        parser.add_argument("--input", required=True, help="The run's input.")
        parser.add_argument("--tenant", help="Tenant slug (needed if ambiguous).")
        parser.add_argument("--wait", action="store_true", help="Follow to the end.")
        parser.add_argument(
            "--inline", action="store_true", help="Advance in this process (no worker)."
        )
        parser.add_argument("--timeout", type=float, default=600.0)

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = self._tenant(options["agent"], options.get("tenant"))
        if not options["inline"]:
            self._check_workers(follow=options["wait"])
        try:
            run = run_start(
                tenant=tenant,
                agent_slug=options["agent"],
                input=options["input"],
                started_by=None,
            )
        except RunInputError as exc:
            raise CommandError(f"{exc.field}: {exc}") from exc
        self.stdout.write(f"run {run.id} queued ({tenant.slug}/{options['agent']})")
        if not (options["wait"] or options["inline"]):
            return
        final = self._follow(run, inline=options["inline"], timeout=options["timeout"])
        detail = f" ({final.stop_detail})" if final.stop_detail else ""
        self.stdout.write(
            f"run {final.id} {final.status}: stop_reason={final.stop_reason}{detail}; "
            f"steps={final.steps} tool_calls={final.tool_calls} "
            f"tokens={final.input_tokens}+{final.output_tokens}"
        )
        if final.final_answer:
            self.stdout.write(f"answer: {final.final_answer}")
        if final.status != Run.Status.SUCCEEDED:
            sys.exit(1)

    def _check_workers(self, *, follow: bool) -> None:
        """Refuse before writing anything when no worker could advance the run."""
        broker = celery_app.conf.broker_url
        hint = (
            "start `make run` in this checkout (its embedded Redis is found "
            "automatically), or set REDIS_URL to the Redis your workers use, "
            "or pass --inline to advance the run in this command"
        )
        redis = redis_status()
        if redis != "ok":
            raise CommandError(
                f"Nothing is running: no Redis at {broker} ({redis}); {hint}."
            )
        if follow and worker_status() != "ok":
            raise CommandError(
                f"Nothing is running: no worker answers on {broker}; {hint}."
            )

    def _tenant(self, agent_slug: str, tenant_slug: str | None) -> Tenant:
        agents = Agent.objects.filter(
            slug=agent_slug, deleted_at__isnull=True
        ).select_related("tenant")
        if tenant_slug:
            agents = agents.filter(tenant__slug=tenant_slug)
        found = list(agents[:2])
        if not found:
            raise CommandError(
                f"No agent {agent_slug!r}"
                + (f" in tenant {tenant_slug!r}." if tenant_slug else ".")
            )
        if len(found) > 1:
            raise CommandError("Several tenants have this agent; pass --tenant.")
        return found[0].tenant

    def _follow(self, run: Run, *, inline: bool, timeout: float) -> Run:
        deadline = time.monotonic() + timeout
        printed = 0
        announced_wait = ""
        while True:
            run.refresh_from_db()
            for step in run.step_rows.order_by("index")[printed:]:
                if step.tool_calls.filter(result__isnull=True).exists() and (
                    run.status in (Run.Status.QUEUED, Run.Status.RUNNING)
                ):
                    break  # print a step once its calls have results
                self.stdout.write(f"step {step.index + 1}: {describe_step(step)}")
                printed += 1
            if run.is_terminal:
                return run
            if run.status == Run.Status.WAITING_APPROVAL:
                pending = run.approvals.filter(status="pending").first()
                key = str(pending.id) if pending else "?"
                if key != announced_wait:
                    tool = pending.tool_name if pending else "a tool call"
                    self.stdout.write(f"waiting for approval {key} of {tool}")
                    announced_wait = key
            if time.monotonic() > deadline:
                raise CommandError(f"run {run.id} did not finish in {timeout:g}s")
            if inline and run.status in (Run.Status.QUEUED, Run.Status.RUNNING):
                run_advance(
                    run_id=str(run.id), step_token=str(run.step_token), owner="cli"
                )
            else:
                time.sleep(0.25)
