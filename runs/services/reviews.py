"""Writes on runs flagged for review (a guardrail tripped or could not run)."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from controlplane.services import audit_record
from runs.models import RunReview
from tracing.services import run_event_append

__all__ = ["ReviewAlreadyDone", "run_review_event", "run_review_mark_reviewed"]


class ReviewAlreadyDone(Exception):
    def __init__(self, review: RunReview) -> None:
        super().__init__(f"already reviewed by {review.reviewed_by or 'someone'}")
        self.review = review


def run_review_event(review: RunReview, type: str) -> None:
    """`run.review_flagged` / `run.review_closed` on the run's log: the tenant
    stream carries them to every open inbox."""
    run_event_append(
        run=review.run,
        type=type,
        payload={"review": str(review.id), "guardrail": review.guardrail,
                 "stage": review.stage, "status": review.status},
    )  # fmt: skip


@transaction.atomic
def run_review_mark_reviewed(
    *, review: RunReview, actor: User, remote_addr: str | None = None
) -> RunReview:
    """Mark the flagged run reviewed (compare-and-set: the first one wins)."""
    updated = RunReview.objects.filter(
        id=review.id, status=RunReview.Status.OPEN
    ).update(
        status=RunReview.Status.REVIEWED,
        reviewed_by=actor,
        reviewed_at=timezone.now(),
    )
    review.refresh_from_db()
    if updated == 0:
        raise ReviewAlreadyDone(review)
    audit_record(
        tenant=review.tenant,
        actor=actor,
        action="run_review.reviewed",
        object_type="run",
        object_id=str(review.run_id),
        before={"status": RunReview.Status.OPEN},
        after={"status": review.status, "guardrail": review.guardrail},
        remote_addr=remote_addr,
    )
    run_review_event(review, "run.review_closed")
    return review
