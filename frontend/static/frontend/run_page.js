// Run detail: header, budget burn, the live trace tree, the span panel and the
// approval controls on the pending call's node.

import { api, ApiError, rowsOf } from "./api.js";
import { decisionFailure, postDecision, sessionExpired, showMessage } from "./decisions.js";
import { approvalForm, forgetDraft, renderDecisionBar } from "./decision_panel.js";
import { approvalDetails, approvalLabel, decisionSummary, duration, el, money, pretty, since, statusBadge, stopReasonLabel, timeLeft, tokens, TERMINAL_RUN, when } from "./format.js";
import { Stream, throttle } from "./stream.js";
import { TraceModel } from "./trace_model.js";
import { TreeView } from "./tree_view.js";
import { firstEvent, TraceLoader } from "./trace_loader.js";
import { TraceFinder } from "./trace_find.js";
import { TimeAxis } from "./time_axis.js";
import { askDenyReason } from "./deny_dialog.js";
import { gauge } from "./gauge.js";
import { SubagentRuns } from "./subagent_runs.js";
import { egressList, payloadSections, totalsTable } from "./span_data.js";

const root = document.getElementById("run-root");
const runId = root.dataset.runId;
const canDecide = root.dataset.canDecide === "1";

const model = (window.cpTrace = new TraceModel());
let run = null;
let approvals = new Map(); // id -> approval of this run or of a sub-agent run under it
// Milestones in ms since navigation start (read by bench/bench_ui.py).
const perf = (window.cpPerf = { start: performance.now() });

const loader = new TraceLoader({ runId, model, perf, hooks: { schedule: () => view.schedule(), flash: (m) => flash(m) } });
const view = new TreeView(document.getElementById("tree"), model, {
  canDecide,
  loadChildren: (node) => loader.loadChildren(node),
  loadMore: (parent) => loader.loadMore(parent),
  onSelect: (node) => selectSpan(node),
  approvalFor: (node) => pendingApprovalFor(node),
  decisionFor: (node) => decisionOf(node),
  costOf: (node) => costOf(node),
  decide: (approvalId, verb, button) => decide(approvalId, verb, button),
  onKey: (event, node) => {
    if (event.key === "z" && node) axis.zoomTo(node);
    else if (event.key === "Z") axis.zoomOut();
    else return finder.key(event);
    return true;
  },
  onZoom: (node) => axis.zoomTo(node),
  afterRender: (count) => {
    axis.update();
    if (!perf.firstRows && count > 0) { perf.firstRows = performance.now(); document.body.dataset.treeReady = "1"; }
    document.getElementById("tree-count").textContent = `${model.size} spans loaded${model.running ? ` · ${model.running} running` : ""}`;
  },
});
const byId = (id) => document.getElementById(id);
const finder = new TraceFinder({
  model, view, loader,
  parts: { input: byId("trace-search"), prev: byId("search-prev"), next: byId("search-next"), nextError: byId("next-error"), status: byId("search-status") },
  hooks: { approvals: () => approvals, flash: (m) => flash(m) },
});
const axis = new TimeAxis({
  view, model,
  parts: { ticks: byId("axis-ticks"), label: byId("axis-label"), reset: byId("axis-reset"), minimap: byId("minimap"), waiting: byId("axis-waiting") },
});
const onSpanSelected = (node) => finder.remember(node);
document.getElementById("tree").addEventListener("focus", () => { if (view.active < 0) view.moveTo(0); });

// ---- approvals -------------------------------------------------------------

// A finished run has nothing left to decide; an external run (an agent sent
// over OTLP) is "finished" from its first span, and its agent's gated calls
// wait in the agent's own process.
function runOver() {
  return Boolean(run && TERMINAL_RUN.has(run.status) && run.stop_reason !== "external");
}

function pendingApprovalFor(node) {
  const a = node.s.attributes || {};
  if (runOver()) return null; // nothing left to decide
  if (!node.s.name.startsWith("approval")) return null;
  const callId = a["gen_ai.tool.call.id"];
  for (const approval of approvals.values()) {
    if (approval.status === "pending" && approval.tool_call_id === callId) return approval;
  }
  return null;
}

// The decision on an approval node, once made: from the approvals API (who,
// when, why, scope, arguments before/after an edit), else from the span's end.
function decisionOf(node) {
  if (!node.s.name.startsWith("approval")) return null;
  const a = node.s.attributes || {};
  const callId = a["gen_ai.tool.call.id"];
  for (const approval of approvals.values()) {
    if (approval.tool_call_id === callId && approval.status !== "pending") return decisionOfApproval(approval);
  }
  const status = a["cp.approval.status"];
  if (!status || status === "pending" || !node.s.ended_at) return null;
  const parse = (v) => { try { return v == null ? null : JSON.parse(v); } catch { return v; } };
  return {
    tool: a["gen_ai.tool.name"], status, decided_by: a["cp.approval.decider"] || null,
    decided_at: a["cp.approval.decided_at"] || null, scope: a["cp.approval.scope"] || null,
    reason: a["cp.approval.decision_reason"] || "", args_edited_by: a["cp.approval.args_edited_by"] || null,
    args_before: parse(a["cp.approval.args_before"]), args_after: parse(a["cp.approval.args_after"]),
  };
}

function decisionOfApproval(approval) {
  const edited = approval.original_args != null;
  return {
    tool: approvalLabel(approval), status: approval.status, decided_by: approval.decided_by,
    decided_at: approval.decided_at, scope: approval.scope, reason: approval.reason,
    args_edited_by: approval.args_edited_by, args_before: edited ? approval.original_args : null,
    args_after: edited ? approval.args : null, run: approval.run,
  };
}

// The sub-agent run an approval read on this page was in (null: this run's):
// its decision and denial here say whose they were.
function childRunOf(a) {
  return a.run && a.run !== runId ? a.run : null;
}

function inChild(d) {
  const child = childRunOf(d);
  return child ? [" in sub-agent ", el("a", { href: `/runs/${child}/`, text: `run ${child.slice(0, 8)}` })] : [];
}

function decisionBox(d, testid) {
  const box = el("section", { class: `decision d-${d.status}`, "data-testid": testid },
    el("h3", { text: "Decision" }),
    el("p", {}, statusBadge(d.status), d.decided_by ? ` by ${d.decided_by}` : ""),
    table([["Decided", d.decided_at ? when(d.decided_at) : "–"], ["Scope", d.scope || "–"], ["Reason", d.reason || "–"]]));
  if (d.args_before != null) {
    box.append(el("p", { class: "small", text: `Arguments edited${d.args_edited_by ? ` by ${d.args_edited_by}` : ""} before approval:` }),
      el("div", { class: "args-diff" },
        el("div", {}, el("span", { class: "muted small", text: "Before (proposed)" }), el("pre", { class: "args", tabindex: "0", "aria-label": "Arguments before", "data-testid": "args-before", text: pretty(d.args_before) })),
        el("div", {}, el("span", { class: "muted small", text: "After (executed)" }), el("pre", { class: "args", tabindex: "0", "aria-label": "Arguments after", "data-testid": "args-after", text: pretty(d.args_after) }))));
  }
  return box;
}

// A question to a person on its call's span (ask_human, an MCP elicitation):
// what was asked, then who answered what (or that nobody did in time).
function questionBox(a) {
  const status = a["cp.question.status"];
  const choices = [].concat(a["cp.question.choices"] || []);
  const box = el("section", { class: "approval-card question", "data-testid": "span-question" },
    el("h3", { text: "Question to a person" }),
    el("blockquote", { "data-testid": "question-text", text: a["cp.question.text"] }));
  if (choices.length) box.append(el("p", { class: "small", text: `Choices: ${choices.join(" · ")}` }));
  box.append(status === "answered"
    ? el("p", { "data-testid": "question-answer" }, `Answered by ${a["cp.question.answered_by"] || "–"}: `, el("strong", { text: a["cp.question.answer"] }))
    : status === "pending"
      ? el("p", {}, statusBadge("waiting_input"), " ", el("a", { href: "/approvals/", text: "answer it in the inbox" }))
      : el("p", { "data-testid": "question-answer", text: `No answer: the question ${status}.` }));
  return box;
}

function approvalNode(approval) {
  for (const node of model.nodes.values()) {
    if (node.s.name.startsWith("approval") && (node.s.attributes || {})["gen_ai.tool.call.id"] === approval.tool_call_id) return node;
  }
  return null;
}

async function loadApprovals() {
  try {
    // This run's and its sub-agent runs' (a child's call waits in the child).
    const pages = await Promise.all([runId, ...subagents.ids].map((id) => api(`/api/v1/approvals/?run=${id}&limit=200`)));
    const rows = pages.flatMap(rowsOf);
    approvals = new Map(rows.map((a) => [a.id, a]));
  } catch { /* keep what we have */ }
  renderBanner();
  if (run) renderRun(); // the header lists the decisions
  const selected = view.selectedId && model.nodes.get(view.selectedId);
  // A decided node shows its decision; a pending one keeps what is typed in its form.
  if (selected && decisionOf(selected)) renderDetail(selected, lastFull);
  view.schedule();
}

function renderBanner() {
  const banner = document.getElementById("approval-banner");
  const over = runOver();
  const pending = over ? [] : [...approvals.values()].filter((a) => a.status === "pending");
  banner.hidden = !pending.length;
  renderDecisionBar(pending, {
    canDecide,
    approve: (approval, extra, button) => decide(approval.id, "approve", button, extra),
    deny: (approval, button) => decide(approval.id, "deny", button),
    review: (approval) => reviewApproval(approval),
  });
  banner.replaceChildren(...pending.map((approval) => {
    const node = approvalNode(approval);
    const item = el("div", { class: "approval-card", "data-approval": approval.id },
      el("strong", {}, "‖ Waiting for approval: ", el("code", { text: approvalLabel(approval) })),
      el("span", { class: "rule", text: `rule: ${approval.rule_reason || approval.rule || "–"}` }),
      el("span", { class: "left", "data-expires": approval.expires_at, text: timeLeft(approval.expires_at) }),
      el("pre", { class: "args", tabindex: "0", "aria-label": `Arguments of ${approvalLabel(approval)}`, text: approvalDetails(approval) }),
    );
    if (node) item.append(el("button", { type: "button", class: "link", text: "Show in trace", onclick: () => view.select(node.id) }));
    else if (canDecide) {
      // The call's node is not in the loaded tree: decide from here.
      item.append(
        el("button", { type: "button", class: "approve", "data-approval": approval.id, "aria-label": `Approve ${approvalLabel(approval)}`, text: "✓ Approve", onclick: (e) => decide(approval.id, "approve", e.target) }),
        el("button", { type: "button", class: "deny", "data-approval": approval.id, "aria-label": `Deny ${approvalLabel(approval)}`, text: "✕ Deny", onclick: (e) => decide(approval.id, "deny", e.target) }),
      );
    }
    return item;
  }));
}

// A message with a way out (log in again) stays until followed: the reads that
// fail after it ("could not load…") would only hide what to do.
let stickyMessage = false;
function flash(message, kind = "error") {
  const value = typeof message === "string" ? { text: message } : message;
  if (stickyMessage && !value?.link) return;
  stickyMessage = Boolean(value?.link);
  showMessage(document.getElementById("run-error"), value, kind);
}

// The bar's "Review" (and its Approve of an edited draft): select the call's
// node so the panel, with its form and diff, is in view.
function reviewApproval(approval) {
  const node = approvalNode(approval);
  if (node) view.select(node.id);
  document.getElementById("detail").scrollIntoView({ block: "start" });
}

// Where a person who must log in again comes back to: this decision.
function returnTo(approval) {
  return `/runs/${runId}/${approval.tool_call_id ? `#call=${encodeURIComponent(approval.tool_call_id)}` : ""}`;
}

// `extra`: what the panel's form adds to an approval (reason, scope, edited args).
async function decide(approvalId, verb, button, extra = {}) {
  const approval = approvals.get(approvalId);
  if (!approval) return;
  let reason = extra.reason || "";
  if (verb === "deny") {
    reason = await askDenyReason(approvalLabel(approval));
    if (reason === null) return;
  }
  const body = { decision: verb, reason };
  if (verb === "approve" && extra.scope) body.scope = extra.scope;
  if (verb === "approve" && extra.args !== undefined) body.args = extra.args;
  if (button) button.disabled = true;
  try {
    const decided = await postDecision(approval, body);
    approvals.set(decided.id, decided);
    forgetDraft(decided.id);
    flash(`${verb === "approve" ? `Approved${body.scope === "run" ? " for the whole run" : ""}` : "Denied"} ${approvalLabel(decided)}.`, "notice");
  } catch (error) {
    if (error instanceof ApiError && error.status === 400 && extra.onFieldErrors) {
      extra.onFieldErrors(error);
    } else {
      const failure = decisionFailure(error, approval, returnTo(approval));
      if (failure.current) approvals.set(failure.current.id, failure.current);
      flash(failure);
    }
    // Logged out: every read would fail too; keep the page as it is.
    if (!sessionExpired(error)) await loadApprovals();
  } finally {
    if (button) button.disabled = false;
  }
  renderBanner();
  view.schedule();
  refreshRun();
}

// ---- run header and budget burn ---------------------------------------------

async function loadRun() {
  try {
    run = await api(`/api/v1/runs/${runId}/`);
  } catch (error) {
    flash(`Could not load the run: ${error.message}`);
    return;
  }
  renderRun();
}
const refreshRun = throttle(loadRun, 1000);

function renderRun() {
  if (TERMINAL_RUN.has(run.status) && renderRun.shown !== run.status) {
    renderRun.shown = run.status;
    loadApprovalsSoon(); // a finished run's approvals may have been cancelled
  }
  document.getElementById("run-status").replaceChildren(statusBadge(run.status), settledBadge());
  const version = run.agent_version ? ` v${run.agent_version}` : "";
  document.getElementById("run-title").textContent = `${run.agent}${version} · ${run.id.slice(0, 8)}`;
  const end = run.finished_at;
  const facts = [
    ["Input", run.input], ["Started by", run.started_by || "–"], ["Created", when(run.created_at)],
    ["Duration", duration(since(run.started_at, end))], ["Steps", run.steps], ["Tool calls", run.tool_calls],
    ["Tokens", `${tokens(run.input_tokens)} in / ${tokens(run.output_tokens)} out`], ["Cost", money(run.cost)],
  ];
  if (run.parent_run) facts.push(["Sub-agent of", el("a", { href: `/runs/${run.parent_run}/`, "data-testid": "run-parent", text: `run ${run.parent_run.slice(0, 8)} (call ${run.parent_call_id || "–"})` }), "run-parent-fact"]);
  if (run.recovery_run) facts.push(["Continues in", el("a", { href: `/runs/${run.recovery_run}/`, "data-testid": "run-recovery", text: `run ${run.recovery_run.slice(0, 8)}, which compacted the context and asked the model again` }), "run-recovery-fact"]);
  if (run.recovers) facts.push(["Recovers", el("a", { href: `/runs/${run.recovers}/`, "data-testid": "run-recovers", text: `run ${run.recovers.slice(0, 8)}, whose model call overflowed the window` }), "run-recovers-fact"]);
  if (run.end_user) facts.push(["End user", el("a", { href: `/end-users/${encodeURIComponent(run.end_user)}/`, "data-testid": "run-end-user", text: run.end_user }), "run-end-user-fact"]);
  if (run.stop_reason) facts.push(["Stop reason", `${stopReasonLabel(run.stop_reason)}${run.stop_detail ? ` — ${run.stop_detail}` : ""}`]);
  if (run.verdict) facts.push(["Outcome", outcomeText(), "run-verdict"]);
  const decided = [...approvals.values()].filter((a) => a.status !== "pending").map(decisionOfApproval);
  if (decided.length) {
    facts.push(["Decisions", el("ul", { class: "decisions" }, ...decided.map((d) => el("li", {},
      el("code", { text: d.tool }), ` ${decisionSummary(d)}`, ...inChild(d),
      d.args_before != null ? el("span", { class: "small" }, el("br"), "before ", el("code", { "data-testid": "run-args-before", text: JSON.stringify(d.args_before) }),
        " → after ", el("code", { "data-testid": "run-args-after", text: JSON.stringify(d.args_after) })) : null))), "run-decisions"]);
  }
  if (run.final_answer) facts.push(["Answer", run.final_answer]);
  document.getElementById("run-facts").replaceChildren(...facts.flatMap(([k, v, testid]) => [el("dt", { text: k }),
    el("dd", { "data-testid": testid }, typeof v === "object" && v !== null ? v : String(v))]));
  const cancel = document.getElementById("cancel-run");
  if (cancel) cancel.hidden = TERMINAL_RUN.has(run.status);
  renderBurn();
}

// An ended run is complete only once settled (its hooks ran and nothing goes
// on for it: a recovery branch, a queued follow-up); until then it finishes.
function settledBadge() {
  if (!TERMINAL_RUN.has(run.status)) return "";
  if (run.settled) return el("span", { class: "settled s-complete", "data-testid": "run-settled", text: "complete" });
  const text = run.recovery_run ? "recovering on a new branch…" : "finishing…";
  return el("span", { class: "settled s-finishing", "data-testid": "run-settled", text });
}

// The verdict in words; a run that failed after a denial says so.
function outcomeText() {
  const { verdict, reason } = run.verdict;
  const label = { passed: "passed", failed: "failed", unverified: "unverified", none: "not evaluated" }[verdict] || verdict;
  let text = `${run.status.replace(/_/g, " ")} — evaluation ${label}: ${reason}`;
  if (run.status !== "succeeded") {
    const denied = [...approvals.values()].filter((a) => a.status === "denied" || a.status === "expired");
    for (const a of denied) {
      const child = childRunOf(a);
      const where = child ? ` in sub-agent run ${child.slice(0, 8)}` : "";
      text += `; ${approvalLabel(a)}${where} was ${a.status}${a.decided_by ? ` by ${a.decided_by}` : ""}${a.reason ? `: “${a.reason}”` : ""}`;
    }
  }
  return text;
}

function renderBurn() {
  // Use against caps as the server's budget counts them (approved extensions
  // included; wall time is the run's active seconds, never a wait for a human).
  const b = run.budget || {};
  const used = (name) => Number(b[name]?.used ?? 0);
  const cap = (name) => (b[name]?.cap == null ? null : Number(b[name].cap));
  const dims = [
    ["Steps", used("steps"), cap("steps")], ["Tool calls", used("tool_calls"), cap("tool_calls")],
    ["Input tokens", used("input_tokens"), cap("input_tokens")], ["Output tokens", used("output_tokens"), cap("output_tokens")],
    ["Cost", used("cost"), cap("cost"), money],
    ["Wall time", used("wall_seconds"), cap("wall_seconds"), (v) => duration(v * 1000)],
  ];
  document.getElementById("burn").replaceChildren(...dims.map(([label, used, cap, fmt = String]) => gauge(label, used, cap, fmt)));
}

document.getElementById("cancel-run")?.addEventListener("click", async (event) => {
  if (!confirm("Cancel this run? Work in progress stops at the next safe point.")) return;
  event.target.disabled = true;
  try {
    run = { ...run, ...(await api(`/api/v1/runs/${runId}/cancel/`, { method: "POST" })) };
    renderRun();
    renderBanner();
    view.schedule();
    flash("Cancelled.", "notice");
  }
  catch (error) { flash(`Could not cancel: ${error.message}`); loadRun(); }
  finally { event.target.disabled = false; }
});

// ---- spans --------------------------------------------------------------------

function stepCost(index) {
  const step = (run?.step_rows || []).find((s) => s.index === index);
  return step ? step.cost : null;
}

function costOf(node) {
  const a = node.s.attributes || {};
  for (const key of ["cp.cost", "cp.usage.cost", "gen_ai.usage.cost"]) if (a[key] != null) return a[key];
  // A resumed step made no model call: its step's cost is on the first span.
  if (a["cp.step.index"] != null && node.s.name.startsWith("step") && !a["cp.step.resumed"]) return stepCost(a["cp.step.index"]);
  if (a["gen_ai.operation.name"] === "invoke_agent" && run) return run.cost;
  return null;
}

// ---- live model output ------------------------------------------------------------
// A streamed reply's text while the model writes: display only, not in the log.
// The chat span stored at its end holds the whole output, so the live text goes
// away then. `offset` says where a batch starts: a repeat is skipped, a gap
// marked; `reset` voids what was shown (a dropped stream asked again, a fallback).

const live = new Map(); // span_id -> text so far

function applyDelta(frame) {
  const node = model.nodes.get(frame.span_id);
  if (node && node.s.ended_at) return; // late: the span has its whole output
  let text = live.get(frame.span_id) ?? "";
  if (frame.reset) text = "";
  else if (frame.offset < text.length) return; // already shown
  else if (frame.offset > text.length) text += " … ";
  live.set(frame.span_id, text + (frame.text || ""));
  renderLive(frame.span_id);
}

function endLive(spanId) {
  if (!live.delete(spanId)) return;
  renderLive(null);
}

function renderLive(spanId) {
  const box = document.getElementById("live-output");
  const id = spanId && live.has(spanId) ? spanId : [...live.keys()].pop();
  if (!id) { box.hidden = true; return; }
  const node = model.nodes.get(id);
  document.getElementById("live-span").textContent = node ? node.s.name : "";
  document.getElementById("live-text").textContent = live.get(id);
  box.dataset.spanId = id;
  box.hidden = false;
}

function applyEvent(event) {
  const type = event.type || "";
  if (type === "span.ended" || type === "span.abandoned") endLive(event.payload.span_id);
  if (type === "span.started" || type === "span.ended" || type === "span.abandoned") {
    const known = model.nodes.has(event.payload.span_id);
    const node = model.upsert(event.payload, { complete: firstEvent(event) });
    // A span new to the page opens, so its children show as they come.
    if (firstEvent(event) && node.children && (!known || node.children.length === 0)) {
      node.expanded = true;
    }
    subagents.see(node);
    if (view.selectedId === node.id) selectSpan(node, { refetch: type !== "span.started" });
    if (type !== "span.started" && (event.payload.attributes || {})["cp.approval.status"]) loadApprovalsSoon();
    view.schedule();
  }
  if (type.startsWith("approval.")) {
    if (event.payload && event.payload.id && approvals.has(event.payload.id)) {
      const current = approvals.get(event.payload.id);
      approvals.set(current.id, { ...current, status: event.payload.status || current.status });
    }
    loadApprovalsSoon();
  }
  // The messages panel (run_messages.js) lists queued and delivered messages.
  if (type.startsWith("message.")) document.dispatchEvent(new CustomEvent("cp:run-message", { detail: event }));
  refreshRun();
}
const loadApprovalsSoon = throttle(loadApprovals, 250);

// ---- sub-agent runs -----------------------------------------------------------------
// A call's child run joins the tree under the call, live while the call is
// open (subagent_runs.js); a grandchild's run joins the same way.

const subagents = (window.cpSubagents = new SubagentRuns({
  model,
  hooks: {
    schedule: () => view.schedule(),
    flash: (m) => flash(m),
    onDelta: (frame) => applyDelta(frame),
    onRun: () => loadApprovalsSoon(),
    onEvent: (event, node) => {
      if (node && view.selectedId === node.id) selectSpan(node, { refetch: event.type !== "span.started" });
      // A child's calls that wait for a person are decided here too.
      const asked = node && event.type !== "span.started" && (event.payload.attributes || {})["cp.approval.status"];
      if (asked || (event.type || "").startsWith("approval.")) loadApprovalsSoon();
    },
  },
}));

// ---- span detail panel ----------------------------------------------------------

let detailToken = 0;
let detailTimer = null;
let lastFull = null; // the selected span as fetched, with its payload bodies
let lastTotals = null; // {id, totals}: the selected span's subtree, as counted by the server

function selectSpan(node, { refetch = true } = {}) {
  lastFull = null;
  if (lastTotals?.id !== node.id) lastTotals = null;
  renderDetail(node, null);
  onSpanSelected(node);
  if (!refetch || node.s.id == null) return;
  clearTimeout(detailTimer);
  const token = ++detailToken;
  detailTimer = setTimeout(async () => {
    // After a search being asked (the next one, typed while this hit is shown).
    await loader.quiet();
    if (token !== detailToken) return;
    const totals = api(`/api/v1/spans/${node.s.id}/subtree/`).catch((error) => ({ error: error.message }));
    try {
      const full = await api(`/api/v1/spans/${node.s.id}/`);
      if (token === detailToken) { lastFull = full; renderDetail(node, full); }
    } catch (error) {
      if (token === detailToken) { lastFull = { error: error.message }; renderDetail(node, lastFull); }
    }
    const counted = await totals;
    if (token !== detailToken) return;
    // Only the totals change: the rest of the panel (a form being typed in)
    // keeps its DOM.
    lastTotals = { id: node.id, totals: counted };
    document.querySelector("#detail [data-testid='span-totals']")?.replaceWith(totalsTable(node.s, costOf(node), counted));
  }, 120);
}

function renderDetail(node, full) {
  const s = full && full.span_id ? full : node.s;
  const a = s.attributes || {};
  const panel = document.getElementById("detail");
  const approval = pendingApprovalFor(node);
  const parts = [el("h2", { id: "detail-title", class: "h3", text: s.name })];
  const start = Date.parse(s.started_at);
  parts.push(el("p", {}, statusBadge(approval ? "waiting_approval" : s.status), " ",
    el("span", { class: "muted", text: `${duration((s.ended_at ? Date.parse(s.ended_at) : Date.now()) - start)} · started ${when(s.started_at)}` })));
  if (s.status_message || s.status === "error" || s.status === "abandoned") {
    parts.push(el("section", { class: "errorbox" }, el("h3", { text: "Error" }), el("pre", { text: s.status_message || a["error.type"] || s.status })));
  }
  for (const event of s.events || []) {
    if (event.name === "exception") parts.push(el("section", { class: "errorbox" }, el("h3", { text: "Exception" }), el("pre", { text: pretty(event.attributes || event) })));
  }
  if (approval) {
    const box = el("section", { class: "approval-card" }, el("h3", { text: "Waiting for approval" }),
      el("p", { text: `Rule: ${approval.rule_reason || approval.rule} · ${timeLeft(approval.expires_at)}` }));
    if (canDecide && approval.kind === "tool_call") {
      box.append(approvalForm(approval, {
        approve: (extra, button) => decide(approval.id, "approve", button, extra),
        deny: (button) => decide(approval.id, "deny", button),
        redraw: () => renderDetail(node, lastFull),
      }));
    }
    else {
      box.append(el("pre", { class: "args", tabindex: "0", "aria-label": `Arguments of ${approvalLabel(approval)}`, text: approvalDetails(approval) }));
      if (canDecide) box.append(
        el("button", { type: "button", class: "approve", "aria-label": `Approve ${approvalLabel(approval)} (panel)`, text: "✓ Approve", onclick: (e) => decide(approval.id, "approve", e.target) }), " ",
        el("button", { type: "button", class: "deny", "aria-label": `Deny ${approvalLabel(approval)} (panel)`, text: "✕ Deny", onclick: (e) => decide(approval.id, "deny", e.target) }));
    }
    parts.push(box);
  }
  const decision = approval ? null : decisionOf(node);
  if (decision) parts.push(decisionBox(decision, "approval-decision"));
  if (a["cp.question.text"] != null) parts.push(questionBox(a));
  const verdict = a["cp.evaluation.verdict"] || (a["gen_ai.operation.name"] === "invoke_agent" && s.ended_at && run?.verdict?.verdict);
  if (verdict) {
    const why = a["cp.evaluation.reason"] ?? run?.verdict?.reason ?? "";
    parts.push(el("section", { class: `verdict v-${verdict}`, "data-testid": "span-verdict" },
      el("h3", { text: "Evaluation" }), el("p", {}, el("strong", { text: verdict }), ` — ${why}`)));
  }
  const inT = a["gen_ai.usage.input_tokens"];
  const outT = a["gen_ai.usage.output_tokens"];
  if (inT != null || outT != null || a["gen_ai.response.model"]) {
    const facts = [];
    if (inT != null || outT != null) facts.push(el("dt", { text: "Tokens" }), el("dd", { "data-testid": "span-tokens", text: `${inT ?? 0} in / ${outT ?? 0} out` }));
    if (a["gen_ai.response.model"]) facts.push(el("dt", { text: "Response model" }), el("dd", { "data-testid": "span-model", text: a["gen_ai.response.model"] }));
    if (a["gen_ai.response.finish_reasons"]) facts.push(el("dt", { text: "Finish" }), el("dd", { text: [].concat(a["gen_ai.response.finish_reasons"]).join(", ") }));
    parts.push(el("dl", { class: "span-facts" }, ...facts));
  }
  parts.push(totalsTable(s, costOf(node), lastTotals?.id === node.id ? lastTotals.totals : null));
  const egress = (s.events || []).filter((event) => event.name === "egress");
  if (egress.length) parts.push(egressList(egress));
  const sandbox = Object.entries(a).filter(([k]) => k.startsWith("cp.sandbox."));
  if (sandbox.length) {
    parts.push(el("section", { class: "sandbox" }, el("h3", { text: "Sandbox enforcement" }), table(sandbox.map(([k, v]) => [k.slice(11), v]))));
  }
  parts.push(...payloadSections(s.payloads || node.s.payloads || {}, full));
  const plain = Object.entries(a).filter(([k]) => !k.startsWith("cp.sandbox."));
  parts.push(el("h3", { text: "Attributes" }), table(plain));
  parts.push(el("p", { class: "muted small" }, el("code", { text: `span ${s.span_id} · trace ${s.trace_id}` })));
  panel.replaceChildren(...parts);
}

function table(entries) {
  return el("table", { class: "attrs" }, el("tbody", {}, ...entries.map(([k, v]) =>
    el("tr", {}, el("th", { scope: "row", text: k }), el("td", { text: typeof v === "object" ? JSON.stringify(v) : String(v) })))));
}

// ---- start ------------------------------------------------------------------------

setInterval(() => {
  if (model.running || [...approvals.values()].some((a) => a.status === "pending")) view.schedule();
  for (const node of document.querySelectorAll("[data-expires]")) node.textContent = timeLeft(node.dataset.expires);
  if (run && !TERMINAL_RUN.has(run.status)) renderBurn();
}, 1000);

const header = Promise.all([loadRun(), loadApprovals()]);
let settleCursor = null;
try {
  settleCursor = await loader.load();
} catch (error) {
  flash(`Could not load the trace: ${error.message}`);
}
await header;
// Sub-agent runs the loaded calls started join the tree (in the background).
for (const node of [...model.nodes.values()]) subagents.see(node);
perf.loaded = performance.now();
view.schedule();
renderBanner();
await finder.openLink();
finder.loadErrors();
requestAnimationFrame(() => { perf.interactive = performance.now(); document.body.dataset.interactive = "1"; });
if (settleCursor) {
  try { await settleCursor(); } catch (error) { flash(`Could not load the trace: ${error.message}`); }
}
// The header was read beside the trace: what happened between that read and the
// stream's cursor (the run ending, say) came with the trace, not as an event.
if (!run || !run.settled) await loadRun();
window.cpStream = new Stream({
  path: `/ws/runs/${runId}/`,
  cursorParam: "after_seq",
  cursor: loader.cursor,
  cursorOf: (event) => event.seq,
  onEvent: applyEvent,
  onDelta: applyDelta,
  poll: async (after) => rowsOf(await api(`/api/v1/runs/${runId}/events/?after_seq=${after ?? 0}&limit=500`)),
  onFatal: (code) => flash(code === 4404 ? "This run is not in your tenant." : "Your session ended; log in again."),
}).start();
