"""A run turned into a proposed eval case ("Add to suite" on the run page).

The proposal holds the run's input; the world it saw, as far as the shop tools
can snapshot it (each order its `lookup_order` calls returned, as the tool
returned it then, in the form of a case's `world.orders`); the decisions people
took on its approvals, as the case's scripted approvals; and graders proposed
from what happened, each with why and whether it is ticked at first. What went
wrong (a denied call, a failed call, no final answer, a write done twice) is
ticked; what went right is offered unticked for a run that failed, so the case
asks for the run's good behaviour only where a person confirms it.

A proposal writes nothing: the person keeps the graders they want and the case
is created through the cases API, which checks it like any other case."""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.db.models import Prefetch

from approvals.models import ApprovalDecision, ApprovalRequest
from runs.evals.definitions import MAX_INPUT_CHARS, MAX_ORDERS, ORDER_ID
from runs.evals.graders import agent_tool_names
from runs.models import Run, ToolCall

# The shop's writes and the world rows a `world_state` grader counts for them.
WRITES = {"create_replacement": "replacements", "refund": "refunds"}
ORDER_FIELDS = ("order_id", "customer", "item", "amount", "status", "damaged", "note")


@dataclass(frozen=True)
class GraderProposal:
    grader: dict[str, Any]
    why: str
    checked: bool

    def as_dict(self) -> dict[str, Any]:
        return {"grader": self.grader, "why": self.why, "checked": self.checked}


@dataclass(frozen=True)
class CaseProposal:
    case: dict[str, Any]  # slug, input, world, approvals; graders chosen apart
    graders: list[GraderProposal]
    notes: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "graders": [g.as_dict() for g in self.graders],
            "notes": self.notes,
        }


def _key_args(args: dict[str, Any]) -> dict[str, Any]:
    """The arguments a proposed grader matches on: the order a shop call is
    about, not its free text (a trial's reason is worded anew)."""
    order_id = args.get("order_id")
    return {"order_id": order_id} if isinstance(order_id, str) else dict(args)


def _order_of(call: ToolCall) -> str | None:
    order_id = (call.args or {}).get("order_id")
    return order_id if isinstance(order_id, str) and ORDER_ID.match(order_id) else None


def _seen_order(call: ToolCall, run: Run) -> dict[str, Any] | None:
    """The order as `lookup_order` returned it to this run, as a world order."""
    data = (call.result or {}).get("data") if call.result else None
    if not isinstance(data, dict) or not ORDER_ID.match(str(data.get("order_id"))):
        return None
    order = {key: data[key] for key in ORDER_FIELDS if key in data}
    delivered = data.get("delivery_date")
    if isinstance(delivered, str):
        try:
            days = (run.created_at.date() - dt.date.fromisoformat(delivered)).days
        except ValueError:
            days = -1
        if 0 <= days <= 3650:
            order["delivered_days_ago"] = days
    return order


def _approvals(run: Run) -> tuple[list[dict[str, Any]], list[GraderProposal]]:
    """The people's decisions as scripted approvals (one per tool: the last),
    and a must-not-call for each call a person denied."""
    requests = (
        ApprovalRequest.objects.filter(
            run=run,
            kind=ApprovalRequest.Kind.TOOL_CALL,
            status__in=(ApprovalRequest.Status.APPROVED, ApprovalRequest.Status.DENIED),
        )
        .select_related("decided_by")
        .prefetch_related(
            Prefetch(
                "decisions",
                queryset=ApprovalDecision.objects.exclude(reason="").order_by(
                    "-created_at"
                ),
            )
        )
        .order_by("requested_at")
    )
    scripted: dict[str, dict[str, Any]] = {}
    graders: list[GraderProposal] = []
    for request in requests:
        who = request.decided_by.get_username() if request.decided_by else "a person"
        given = request.decisions.all()  # reasons given, latest first
        reason = given[0].reason if given else ""
        if request.status == ApprovalRequest.Status.DENIED:
            scripted[request.tool_name] = {
                "tool": request.tool_name,
                "decision": "deny",
                **({"reason": reason} if reason else {}),
            }
            graders.append(
                GraderProposal(
                    {
                        "kind": "must_not_call",
                        "tool": request.tool_name,
                        "args": _key_args(request.args_snapshot),
                        "status": "succeeded",
                    },
                    f"{who} denied this call"
                    + (f": {reason}" if reason else "")
                    + "; the case asks that it does not run",
                    True,
                )
            )
        elif request.original_args is not None:
            scripted[request.tool_name] = {
                "tool": request.tool_name,
                "decision": "edit",
                "args": request.args_snapshot,
            }
        else:
            scripted[request.tool_name] = {
                "tool": request.tool_name,
                "decision": "approve",
            }
    return list(scripted.values()), graders


def run_case_proposal(*, run: Run) -> CaseProposal:
    calls = list(
        ToolCall.objects.filter(run=run)
        .select_related("step")
        .order_by("step__index", "position")
    )
    good_run = run.status == Run.Status.SUCCEEDED
    notes: list[str] = []
    world: dict[str, dict[str, Any]] = {}
    for call in calls:
        if (
            call.tool_name == "lookup_order"
            and call.status == ToolCall.Status.SUCCEEDED
        ):
            order = _seen_order(call, run)
            if order is not None and len(world) < MAX_ORDERS:
                world.setdefault(order["order_id"], order)
    approvals, graders = _approvals(run)

    succeeded: dict[str, ToolCall] = {}
    failed: dict[str, ToolCall] = {}
    writes: Counter[tuple[str, str]] = Counter()
    for call in calls:
        if call.status == ToolCall.Status.SUCCEEDED:
            succeeded.setdefault(call.tool_name, call)
            order_id = _order_of(call)
            if call.tool_name in WRITES and order_id:
                writes[(call.tool_name, order_id)] += 1
        elif call.status in (ToolCall.Status.FAILED, ToolCall.Status.REFUSED):
            failed.setdefault(call.tool_name, call)

    for tool, call in failed.items():
        if tool in succeeded:
            continue
        error = ((call.result or {}).get("error") or {}) if call.result else {}
        what = f"{error.get('code')}: {error.get('message')}" if error else call.status
        graders.append(
            GraderProposal(
                {"kind": "must_call", "tool": tool, "status": "succeeded"},
                f"{tool} {call.status} in this run ({what}); the case asks for a "
                "call that succeeds",
                True,
            )
        )
    for tool, call in succeeded.items():
        args = _key_args(call.args or {}) if _order_of(call) else {}
        graders.append(
            GraderProposal(
                {"kind": "must_call", "tool": tool, **({"args": args} if args else {})},
                f"called and succeeded in this run (step {call.step.index})",
                good_run,
            )
        )
    for (tool, order_id), count in sorted(writes.items()):
        graders.append(
            GraderProposal(
                {
                    "kind": "world_state",
                    "object": WRITES[tool],
                    "order_id": order_id,
                    "count": 1,
                },
                f"{tool} ran {count} times for order {order_id}; the case asks for "
                "exactly one"
                if count > 1
                else f"{tool} ran once for order {order_id}",
                count > 1 or good_run,
            )
        )
    if not good_run:
        called = {call.tool_name for call in calls}
        version = run.agent_version
        for tool in sorted(agent_tool_names(version) - called if version else ()):
            graders.append(
                GraderProposal(
                    {"kind": "must_call", "tool": tool},
                    "not called in this run: tick it if the agent should have",
                    False,
                )
            )
    answer = (run.final_answer or "").strip()
    if not answer:
        stop = f", {run.stop_reason}" if run.stop_reason else ""
        graders.append(
            GraderProposal(
                {"kind": "final_answer_regex", "pattern": r"\S"},
                f"the run ended {run.status}{stop} with no final answer",
                True,
            )
        )
    text = run.input
    if len(text) > MAX_INPUT_CHARS:
        text = text[:MAX_INPUT_CHARS]
        notes.append(f"the input is cut to its first {MAX_INPUT_CHARS} characters")
    if not world:
        notes.append("no order was looked up: the case has no world")
    case = {
        "slug": f"run-{re.sub(r'[^0-9a-f]', '', str(run.id))[:12]}",
        "input": text,
        "world": {"orders": list(world.values())} if world else {},
        "approvals": approvals,
    }
    return CaseProposal(case=case, graders=graders, notes=notes)
