"""Writes of evaluation suites and cases (docs/evals.md): each checked whole
before anything is written, in one transaction, and audited. A suite always
has at least one case."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Max

from controlplane.models import Tenant
from controlplane.services import audit_record
from runs.evals.definitions import (
    DefinitionError,
    Problems,
    case_validate,
    suite_validate,
)
from runs.evals.selectors import eval_case_document, eval_suite_document
from runs.evals.suite_files import suite_file_parse
from runs.models import EvalCase, EvalSuite

__all__ = [
    "DefinitionError",
    "EvalSuiteInUse",
    "eval_case_create",
    "eval_case_delete",
    "eval_case_update",
    "eval_suite_create",
    "eval_suite_delete",
    "eval_suite_import",
    "eval_suite_update",
]

SUITE_FIELDS = ("name", "description", "agent")


class EvalSuiteInUse(Exception):
    """A suite with eval runs keeps existing (their results refer to it)."""


class LastCase(Exception):
    """The only case of a suite is not deleted: a suite has at least one."""


def _audit(
    *,
    suite: EvalSuite,
    actor: User | None,
    action: str,
    before: Any = None,
    after: Any = None,
    remote_addr: str | None = None,
) -> None:
    audit_record(
        tenant=suite.tenant,
        actor=actor,
        action=action,
        object_type="eval_suite",
        object_id=str(suite.id),
        before=before,
        after=after,
        remote_addr=remote_addr,
    )


def _cases_write(suite: EvalSuite, cases: list[dict[str, Any]]) -> None:
    EvalCase.objects.bulk_create(
        EvalCase(
            suite=suite,
            position=position,
            slug=case["slug"],
            input=case["input"],
            world=case["world"],
            approvals=case["approvals"],
            graders=case["graders"],
        )
        for position, case in enumerate(cases)
    )


@transaction.atomic
def eval_suite_create(
    *,
    tenant: Tenant,
    actor: User | None,
    document: Any,
    remote_addr: str | None = None,
) -> EvalSuite:
    """A new suite from a whole document (the YAML file's shape)."""
    checked = suite_validate(document)
    if EvalSuite.objects.filter(tenant=tenant, slug=checked["slug"]).exists():
        raise DefinitionError({"slug": [f"suite {checked['slug']!r} exists"]})
    try:
        with transaction.atomic():
            suite = EvalSuite.objects.create(
                tenant=tenant,
                slug=checked["slug"],
                name=checked["name"],
                description=checked["description"],
                default_agent=checked["agent"],
            )
    except IntegrityError:  # made by a concurrent request meanwhile
        raise DefinitionError({"slug": [f"suite {checked['slug']!r} exists"]}) from None
    _cases_write(suite, checked["cases"])
    _audit(suite=suite, actor=actor, action="eval_suite.create", after=checked,
           remote_addr=remote_addr)  # fmt: skip
    return suite


@transaction.atomic
def eval_suite_import(
    *,
    tenant: Tenant,
    actor: User | None,
    text: str,
    remote_addr: str | None = None,
) -> tuple[EvalSuite, bool]:
    """A suite file, imported: a new suite, or the existing one of its slug made
    exactly what the file says (its cases replaced). Returns (suite, created)."""
    checked = suite_file_parse(text)
    suite = (
        EvalSuite.objects.select_for_update()
        .filter(tenant=tenant, slug=checked["slug"])
        .first()
    )
    if suite is None:
        return (
            eval_suite_create(tenant=tenant, actor=actor, document=checked,
                              remote_addr=remote_addr),
            True,
        )  # fmt: skip
    before = eval_suite_document(suite=suite)
    suite.name = checked["name"]
    suite.description = checked["description"]
    suite.default_agent = checked["agent"]
    suite.save(update_fields=["name", "description", "default_agent", "updated_at"])
    EvalCase.objects.filter(suite=suite).delete()
    _cases_write(suite, checked["cases"])
    _audit(suite=suite, actor=actor, action="eval_suite.import", before=before,
           after=checked, remote_addr=remote_addr)  # fmt: skip
    return suite, False


@transaction.atomic
def eval_suite_update(
    *,
    suite: EvalSuite,
    actor: User | None,
    fields: Mapping[str, Any],
    remote_addr: str | None = None,
) -> EvalSuite:
    """Change a suite's name, description or default agent (its cases have
    their own writes)."""
    problems = Problems()
    for key in fields:
        if key not in SUITE_FIELDS:
            problems.add(key, f"unknown key; allowed: {', '.join(SUITE_FIELDS)}")
    problems.raise_any()
    locked = EvalSuite.objects.select_for_update().get(pk=suite.pk)
    before = eval_suite_document(suite=locked)
    document = {**before, **fields}
    checked = suite_validate(document)
    locked.name = checked["name"]
    locked.description = checked["description"]
    locked.default_agent = checked["agent"]
    locked.save(update_fields=["name", "description", "default_agent", "updated_at"])
    _audit(suite=locked, actor=actor, action="eval_suite.update",
           before={k: before[k] for k in SUITE_FIELDS},
           after={k: checked[k] for k in SUITE_FIELDS},
           remote_addr=remote_addr)  # fmt: skip
    return locked


@transaction.atomic
def eval_suite_delete(
    *, suite: EvalSuite, actor: User | None, remote_addr: str | None = None
) -> None:
    """Delete a suite and its cases; refused (EvalSuiteInUse) if it has eval runs."""
    locked = EvalSuite.objects.select_for_update().get(pk=suite.pk)
    runs = locked.eval_runs.count()
    if runs:
        raise EvalSuiteInUse(
            f"suite {locked.slug} has {runs} eval run(s); their results refer to it"
        )
    before = eval_suite_document(suite=locked)
    _audit(suite=locked, actor=actor, action="eval_suite.delete", before=before,
           remote_addr=remote_addr)  # fmt: skip
    locked.delete()


@transaction.atomic
def eval_case_create(
    *,
    suite: EvalSuite,
    actor: User | None,
    definition: Any,
    remote_addr: str | None = None,
) -> EvalCase:
    """A case added at the end of the suite."""
    checked = case_validate(definition)
    locked = EvalSuite.objects.select_for_update().get(pk=suite.pk)
    if EvalCase.objects.filter(suite=locked, slug=checked["slug"]).exists():
        raise DefinitionError({"slug": [f"case {checked['slug']!r} exists"]})
    last = EvalCase.objects.filter(suite=locked).aggregate(top=Max("position"))
    case = EvalCase.objects.create(
        suite=locked,
        position=(last["top"] or 0) + 1,
        slug=checked["slug"],
        input=checked["input"],
        world=checked["world"],
        approvals=checked["approvals"],
        graders=checked["graders"],
    )
    _audit(suite=locked, actor=actor, action="eval_case.create", after=checked,
           remote_addr=remote_addr)  # fmt: skip
    return case


@transaction.atomic
def eval_case_update(
    *,
    case: EvalCase,
    actor: User | None,
    definition: Mapping[str, Any],
    partial: bool,
    remote_addr: str | None = None,
) -> EvalCase:
    """Replace a case's definition (PUT) or some of its keys (PATCH)."""
    EvalSuite.objects.select_for_update().get(pk=case.suite_id)
    locked = EvalCase.objects.get(pk=case.pk)
    before = eval_case_document(locked)
    checked = case_validate({**before, **definition} if partial else definition)
    if (
        checked["slug"] != locked.slug
        and EvalCase.objects.filter(
            suite_id=locked.suite_id, slug=checked["slug"]
        ).exists()
    ):
        raise DefinitionError({"slug": [f"case {checked['slug']!r} exists"]})
    for name in ("slug", "input", "world", "approvals", "graders"):
        setattr(locked, name, checked[name])
    locked.save()
    _audit(suite=locked.suite, actor=actor, action="eval_case.update",
           before=before, after=checked, remote_addr=remote_addr)  # fmt: skip
    return locked


@transaction.atomic
def eval_case_delete(
    *, case: EvalCase, actor: User | None, remote_addr: str | None = None
) -> None:
    """Delete a case; the last one of its suite is kept (LastCase)."""
    suite = EvalSuite.objects.select_for_update().get(pk=case.suite_id)
    if EvalCase.objects.filter(suite=suite).count() <= 1:
        raise LastCase(
            f"case {case.slug} is the only case of suite {suite.slug}; a suite "
            "has at least one (delete the suite instead)"
        )
    _audit(suite=suite, actor=actor, action="eval_case.delete",
           before=eval_case_document(case), remote_addr=remote_addr)  # fmt: skip
    case.delete()
