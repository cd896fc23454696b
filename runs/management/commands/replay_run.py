"""`manage.py replay_run <run id>`: re-run a recorded run from its record (no tool
is executed again) and report whether the new trace matches step by step."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runs.models import Run
from runs.replay import run_replay


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run_id")

    def handle(self, *args: Any, **options: Any) -> None:
        run = Run.objects.filter(id=options["run_id"]).first()
        if run is None:
            raise CommandError(f"no run {options['run_id']}")
        report = run_replay(run=run)
        for line in report.lines:
            self.stdout.write(line)
        if not report.matches:
            raise CommandError(
                "the replay does not match the recorded run; its diff: "
                f"/runs/{run.id}/replay/ (API: /api/v1/runs/{run.id}/replay-diff/)"
            )
        self.stdout.write(self.style.SUCCESS("the replay matches the record"))
