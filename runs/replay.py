"""Replay a recorded run in memory and compare it with the record step by step.

The model is the scripted model built from the run's recorded replies; every
tool is answered from the run's recorded results (by call id) and never
executed; approvals resolve as they were decided; the agent's evaluator judges
the replayed transcript (evaluators read recorded observations, never the live
world). Nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from approvals.models import ApprovalRequest
from budgets.selectors import budget_of
from runs.engine.adapters.scripted import ScriptedModel
from runs.engine.enforcement import NO_RETRIES, REPEATED_ERROR_RULE
from runs.engine.envelope import ErrorCode, ToolResult
from runs.engine.loop import ApprovalResolution, LoopResult, run_in_process
from runs.engine.tools import Tool, ToolContext, ToolRegistry
from runs.models import Run, ToolCall
from runs.runtime import runtime_for

__all__ = ["ReplayReport", "run_replay"]


@dataclass
class ReplayReport:
    run_id: str
    lines: list[str] = field(default_factory=list)
    matches: bool = True
    result: LoopResult | None = (
        None  # the replayed run, for the diff (runs/run_diff.py)
    )

    def differ(self, line: str) -> None:
        self.matches = False
        self.lines.append(f"DIFF {line}")

    def same(self, line: str) -> None:
        self.lines.append(f"same {line}")


def _recorded_tool(tool: Tool, results: dict[str, dict[str, Any]]) -> Tool:
    def answer(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        recorded = results.get(ctx.call_id)
        if recorded is None:
            return ToolResult.failure(
                ErrorCode.EINTERNAL,
                f"replay: no recorded result for call {ctx.call_id}; not executed",
            )
        return ToolResult.from_dict(recorded)

    def as_recorded(arguments: Any, ctx: ToolContext) -> None:
        return None  # the record already says whether the preconditions held

    return Tool(tool.contract, answer, as_recorded, tool.timeout_seconds)


def run_replay(*, run: Run) -> ReplayReport:
    """Re-run `run` from its record and report where the new trace differs."""
    report = ReplayReport(run_id=str(run.id))
    steps = list(run.step_rows.order_by("index"))
    calls = {row.call_id: row for row in ToolCall.objects.filter(run=run)}
    results = {cid: row.result for cid, row in calls.items() if row.result is not None}
    runtime = runtime_for(run, replies_consumed=0, budget=budget_of(run.tenant_id))
    registry = ToolRegistry([_recorded_tool(t, results) for t in runtime.registry])
    model = ScriptedModel.from_recorded([step.reply for step in steps])

    # A repeated tool error's questions to a person, answered as they were.
    asked = iter(
        ApprovalRequest.objects.filter(
            run=run, kind=ApprovalRequest.Kind.TOOL_ERROR
        ).order_by("requested_at")
    )

    def approver(call: Any, tool: Any, decision: Any) -> ApprovalResolution:
        if decision.rule == REPEATED_ERROR_RULE:
            question = next(asked, None)
            approved = question is not None and question.status == "approved"
            return ApprovalResolution(approved=approved, reason="as recorded")
        row = calls.get(call.call_id)
        denied = row is None or row.status == ToolCall.Status.DENIED
        return ApprovalResolution(approved=not denied, reason="as recorded")

    result = run_in_process(
        # The recorded results already include any automatic retries.
        replace(runtime.config, retry=NO_RETRIES),
        model,
        registry,
        user_input=run.input,
        limits=runtime.limits,
        policy=runtime.policy,
        approver=approver,
        evaluator=runtime.evaluator,
        run_id=str(run.id),
        tenant_id=str(run.tenant_id),
    )
    report.result = result
    for index in range(max(len(steps), len(result.steps))):
        old = steps[index] if index < len(steps) else None
        new = result.steps[index] if index < len(result.steps) else None
        if old is None or new is None:
            report.differ(
                f"step {index}: only in the {'replay' if old is None else 'record'}"
            )
            continue
        recorded = [
            (row.tool_name, row.args_sha256, bool((row.result or {}).get("ok")))
            for row in old.tool_calls.order_by("position")
        ]
        replayed = [
            (call.name, call.arguments_sha256, res.ok)
            for call, res in zip(new.calls, new.results, strict=False)
        ]
        if recorded == replayed:
            report.same(
                f"step {index}: {[name for name, _, _ in recorded] or 'answer'}"
            )
        else:
            report.differ(f"step {index}: recorded {recorded}, replayed {replayed}")
    if (result.final_text or "") != (run.final_answer or ""):
        report.differ("final answer differs")
    if str(result.status) != run.status:
        report.differ(f"status: recorded {run.status}, replayed {result.status}")
    else:
        report.same(f"status {run.status}")
    return report
