"""`python manage.py eval run SUITE --agent SLUG[@VERSION] --k 5 --gate ...`: the
CI gate (docs/evals.md, "Eval runs and the CI command")."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from controlplane.health import redis_status, worker_status
from controlplane.models import Membership, Tenant
from runs.engine.eval_gate import Gate, evaluate_gate, parse_gate, regression_check
from runs.engine.eval_report import progress_line, suite_report_lines
from runs.engine.junit import JUnitRun, junit_xml
from runs.evals.results import (
    OPEN_TRIALS,
    eval_run_latest_finished,
    eval_run_progress,
    eval_run_suite_summary,
)
from runs.models import Agent, EvalRun, EvalSuite, EvalTrial
from runs.services import RunConflict, run_cancel
from runs.services.eval_runs import EvalRunRefused, eval_run_start, eval_runs_sweep

POLL_SECONDS = 0.5


class Command(BaseCommand):
    help = (
        "Run an eval suite against an agent version through the workers, print one "
        "line per case and the suite's figures, write JUnit XML, and exit 1 when "
        "the gate or the regression check against the baseline fails."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("action", choices=["run"], help="What to do: run.")
        parser.add_argument("suite", help="The suite's slug.")
        parser.add_argument(
            "--agent", required=True, help="SLUG or SLUG@VERSION (a version number)."
        )
        parser.add_argument("--k", type=int, default=5, help="Trials per case.")
        parser.add_argument("--gate", help='e.g. "pass^k>=0.8 and cost<=0.05".')
        parser.add_argument(
            "--baseline",
            help="LAST (the latest finished eval run of this suite and agent) or "
            "an eval run id: fail on a regression against it.",
        )
        parser.add_argument("--junit", help="Write JUnit XML to this file.")
        parser.add_argument("--timeout", type=float, default=1800.0)
        parser.add_argument("--tenant", help="Tenant slug (needed if ambiguous).")
        parser.add_argument(
            "--user",
            help="Username the eval run is started and its scripted approvals "
            "decided as (a member whose role may decide approvals). Without one "
            "a trial that meets an approval is cancelled.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # Everything that can be wrong with the command line is found before
        # anything is started.
        gate = self._gate(options.get("gate"))
        slug, _, number = options["agent"].partition("@")
        version = self._version_number(number) if number else None
        tenant = self._tenant(options["suite"], options.get("tenant"))
        suite = EvalSuite.objects.get(tenant=tenant, slug=options["suite"])
        user = self._user(tenant, options.get("user"))
        agent = Agent.objects.filter(
            tenant=tenant, slug=slug, deleted_at__isnull=True
        ).first()
        if agent is None:
            raise CommandError(f"agent: no agent {slug!r} in tenant {tenant.slug}")
        baseline = self._baseline(options.get("baseline"), tenant, suite, agent)
        self._check_workers()
        try:
            eval_run = eval_run_start(
                tenant=tenant, suite=suite, agent_slug=slug, version=version,
                k=options["k"], user=user,
            )  # fmt: skip
        except EvalRunRefused as refused:
            raise CommandError(str(refused)) from None
        self.stdout.write(
            f"eval run {eval_run.id}: suite {suite.slug}, agent {slug} "
            f"v{eval_run.version_number}, k={eval_run.k}"
        )
        finished = self._follow(eval_run, options["timeout"])
        summary = eval_run_suite_summary(finished)
        if summary is None:
            raise CommandError(f"eval run {finished.id} has no graded trial")
        for line in suite_report_lines(summary):
            self.stdout.write(line)
        for note in finished.summary.get("notes", []):
            self.stdout.write(f"note: {note}")
        if options.get("junit"):
            Path(options["junit"]).write_text(
                junit_xml([JUnitRun(name=suite.slug, summary=summary,
                                    run_id=str(finished.id),
                                    timestamp=finished.started_at)]),
                encoding="utf-8",
            )  # fmt: skip
            self.stdout.write(f"JUnit XML written to {options['junit']}")
        failed = False
        if gate is not None:
            result = evaluate_gate(gate, summary)
            for clause in result.clauses:
                self.stdout.write(f"gate {clause.describe()}")
            failed |= not result.passed
        if baseline is not None:
            base = eval_run_suite_summary(baseline)
            assert base is not None  # a finished eval run has graded trials
            try:
                regression = regression_check(baseline=base, current=summary)
            except ValueError as exc:
                self.stdout.write(f"regression check against {baseline.id}: {exc}")
                failed = True
            else:
                for reason in regression.reasons:
                    self.stdout.write(f"regression: {reason}")
                verdict = "ok" if regression.passed else "FAILED"
                self.stdout.write(f"regression check against {baseline.id}: {verdict}")
                failed |= not regression.passed
        self.stdout.write("eval FAILED" if failed else "eval passed")
        if failed:
            sys.exit(1)

    def _gate(self, expression: str | None) -> Gate | None:
        if expression is None:
            return None
        try:
            return parse_gate(expression)
        except ValueError as exc:
            raise CommandError(str(exc)) from None

    def _version_number(self, text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise CommandError(f"agent: version {text!r} is not a version number")
        return int(text)

    def _tenant(self, suite_slug: str, tenant_slug: str | None) -> Tenant:
        suites = EvalSuite.objects.filter(slug=suite_slug).select_related("tenant")
        if tenant_slug:
            suites = suites.filter(tenant__slug=tenant_slug)
        found = list(suites[:2])
        if not found:
            where = f" in tenant {tenant_slug!r}" if tenant_slug else ""
            raise CommandError(f"suite: no suite {suite_slug!r}{where}")
        if len(found) > 1:
            raise CommandError("Several tenants have this suite; pass --tenant.")
        return found[0].tenant

    def _user(self, tenant: Tenant, username: str | None) -> Any:
        if username is None:
            return None
        user = get_user_model().objects.filter(username=username).first()
        member = Membership.objects.filter(
            tenant=tenant, user=user, deactivated_at__isnull=True
        ).exists()
        if user is None or not member:
            raise CommandError(f"user: {username!r} is not a member of {tenant.slug}")
        return user

    def _baseline(
        self, choice: str | None, tenant: Tenant, suite: EvalSuite, agent: Agent
    ) -> EvalRun | None:
        if choice is None:
            return None
        if choice.upper() == "LAST":
            found = eval_run_latest_finished(
                tenant=tenant, suite_id=suite.id, agent_id=agent.id
            )
            if found is None:
                self.stdout.write(
                    f"no baseline: no finished eval run of {suite.slug} for "
                    f"{agent.slug} yet (this one becomes the next LAST)"
                )
            return found
        try:
            wanted = uuid.UUID(choice)
        except ValueError:
            raise CommandError(
                f"baseline: {choice!r} is neither LAST nor an eval run id"
            ) from None
        found = EvalRun.objects.filter(
            tenant=tenant, id=wanted, suite=suite, status=EvalRun.Status.FINISHED
        ).first()
        if found is None:
            raise CommandError(
                f"baseline: no finished eval run {choice} of suite {suite.slug}"
            )
        return found

    def _check_workers(self) -> None:
        """Refuse before starting anything when no worker could run the trials."""
        if redis_status() != "ok" or worker_status() != "ok":
            raise CommandError(
                "Nothing is running: no worker answers; start `make run` or point "
                "REDIS_URL at the Redis your workers use."
            )

    def _follow(self, eval_run: EvalRun, timeout: float) -> EvalRun:
        """Redraw the progress line until every trial is graded. The sweep is
        asked here too: it is idempotent, and a run ended outside a step task
        (a cancel) is graded without waiting for beat."""
        deadline = time.monotonic() + timeout
        shown = ""
        while True:
            eval_runs_sweep(eval_run_id=eval_run.id)
            eval_run.refresh_from_db()
            done, total, passed = eval_run_progress(eval_run)
            line = progress_line(done, total, passed)
            if line != shown:
                self.stdout.write(line)
                shown = line
            if eval_run.status != EvalRun.Status.RUNNING:
                return eval_run
            if time.monotonic() > deadline:
                self._cancel_open(eval_run)
                raise CommandError(
                    f"eval run {eval_run.id} did not finish in {timeout:g}s; its "
                    "open trials were cancelled"
                )
            time.sleep(POLL_SECONDS)

    def _cancel_open(self, eval_run: EvalRun) -> None:
        open_trials = EvalTrial.objects.filter(
            eval_run=eval_run, status__in=OPEN_TRIALS, run__isnull=False
        ).select_related("run")
        for trial in open_trials:
            assert trial.run is not None
            try:
                run_cancel(run=trial.run, actor=None)
            except RunConflict:
                continue  # it ended meanwhile
