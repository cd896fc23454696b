// Formatting shared by the pages: status icon + word (never colour alone), times, money.

const STATUS = {
  queued: ["◷", "queued"], running: ["⟳", "running"], waiting_approval: ["‖", "waiting for approval"], waiting_input: ["?", "waiting for an answer"], waiting_subagents: ["⋯", "waiting for its sub-agents"],
  succeeded: ["✓", "succeeded"], failed: ["✕", "failed"], unverified: ["?", "unverified"],
  budget_exhausted: ["$", "budget exhausted"], policy_blocked: ["⊗", "policy blocked"],
  cancelled: ["⊘", "cancelled"], ok: ["✓", "ok"], error: ["✕", "error"], unset: ["•", "done"],
  abandoned: ["☠", "abandoned"], pending: ["‖", "pending"], approved: ["✓", "approved"],
  denied: ["✕", "denied"], expired: ["⊖", "expired"],
};

// Why a run stopped, in words (runs/engine/stop.py; an unknown reason shows as is).
const STOP_REASONS = {
  done: "done", max_steps: "step cap reached", max_tool_calls: "tool-call cap reached",
  max_tokens: "token cap reached", max_cost: "cost cap reached", deadline: "deadline passed",
  no_progress: "no progress (the same step repeated)", policy_denied: "denied by policy",
  repeated_error: "repeated error (a tool failed the same way twice)",
  cancelled: "cancelled", model_error: "model error", internal_error: "internal error",
  guardrail_tripped: "stopped by a guardrail",
  guardrail_unavailable: "guardrail could not run (failed closed)",
  hook_blocked: "stopped by a hook", hook_failed: "a hook failed (blocked)",
  context_overflow: "context longer than the model's window (recovered on a new branch)",
  compaction_failed: "compaction failed",
};

export function stopReasonLabel(reason) {
  return STOP_REASONS[reason] ? `${STOP_REASONS[reason]} (${reason})` : String(reason);
}

export const TERMINAL_RUN = new Set(["succeeded", "failed", "unverified", "budget_exhausted", "policy_blocked", "cancelled"]);

export function statusParts(status) {
  return STATUS[status] || ["•", String(status || "unknown").replace(/_/g, " ")];
}

// <span class="status s-…"><span aria-hidden>icon</span> word</span>
export function statusBadge(status, { short = false } = {}) {
  const [icon, word] = statusParts(status);
  const el = document.createElement("span");
  el.className = `status s-${status}`;
  const i = document.createElement("span");
  i.className = "icon";
  i.setAttribute("aria-hidden", "true");
  i.textContent = icon;
  el.append(i);
  if (short) {
    el.title = word;
    const sr = document.createElement("span");
    sr.className = "sr-only";
    sr.textContent = word;
    el.append(sr);
  } else {
    el.append(" " + word);
  }
  return el;
}

export function duration(ms) {
  if (ms == null || Number.isNaN(ms)) return "–";
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${Math.round(s % 60)}s`;
  return `${Math.floor(m / 60)}h ${m % 60}m`;
}

export function since(iso, until) {
  if (!iso) return null;
  const end = until ? Date.parse(until) : Date.now();
  return end - Date.parse(iso);
}

export function timeLeft(iso) {
  if (!iso) return "";
  const ms = Date.parse(iso) - Date.now();
  if (ms <= 0) return "expired";
  return `${duration(ms)} left`;
}

export function tokens(n) {
  if (n == null || n === "") return "–";
  n = Number(n);
  return n >= 10000 ? `${(n / 1000).toFixed(1)}k` : String(n);
}

export function money(v) {
  if (v == null || v === "") return "–";
  const n = Number(v);
  if (!n) return "$0";
  return n < 0.01 ? `$${n.toFixed(4)}` : `$${n.toFixed(2)}`;
}

export function when(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });
}

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c != null) node.append(c);
  return node;
}

// Brings `node`'s children in line with `children` in place: a node of the
// same kind at the same position is kept, its attributes and content patched.
// A refresh that swapped the link under the pointer would swallow a click
// pressed before it and released after. Listeners on `children` are not kept.
export function patchChildren(node, ...children) {
  const next = children.filter((c) => c != null).map((c) => (typeof c === "string" ? document.createTextNode(c) : c));
  next.forEach((child, i) => {
    const old = node.childNodes[i];
    if (!old) node.append(child);
    else if (old.nodeName !== child.nodeName) old.replaceWith(child);
    else if (old.nodeType === Node.TEXT_NODE) { if (old.data !== child.data) old.data = child.data; }
    else {
      for (const { name } of [...old.attributes]) if (!child.hasAttribute(name)) old.removeAttribute(name);
      for (const { name, value } of child.attributes) if (old.getAttribute(name) !== value) old.setAttribute(name, value);
      patchChildren(old, ...child.childNodes);
    }
  });
  while (node.childNodes.length > next.length) node.lastChild.remove();
}

export function pretty(value) {
  if (typeof value === "string") {
    try { return JSON.stringify(JSON.parse(value), null, 2); } catch { return value; }
  }
  return JSON.stringify(value, null, 2);
}

// What an approval decides, in a few words: the tool, "extend <dimension> by X"
// for a budget extension (a refused reservation the tenant asked to be asked about),
// or "<tool> failed repeatedly: go on?" for a tool error (docs/engine.md).
export function approvalLabel(approval) {
  return approval.kind === "tool_call" ? approval.tool : approval.summary;
}

// The facts a decider needs: the tool's arguments, or the extension's numbers.
export function approvalDetails(approval) {
  if (approval.kind === "tool_error") {
    return `${pretty(approval.args)}\napprove: the run goes on (the model sees the error)` +
      "\ndeny: the run ends repeated_error";
  }
  if (approval.kind !== "budget_extension" || !approval.extension) return pretty(approval.args);
  const x = approval.extension;
  return `${x.detail}\nlimit ${x.limit} · used or reserved ${x.used} · this call needs ${x.wanted}` +
    `\napprove: ${x.scope === "period" ? `this run may spend ${x.amount} more ${x.name} per ${x.period}` : `the run's ${x.name} becomes ${Number(x.limit) + Number(x.amount)}`}` +
    `\ndeny: the run ends budget_exhausted (${x.stop_reason})`;
}

// A decided approval in one line: what, who, when, the scope and the reason.
// `d`: {status, decided_by, decided_at, scope, reason}.
export function decisionSummary(d) {
  const parts = [`${statusParts(d.status)[1]}${d.decided_by ? ` by ${d.decided_by}` : ""}`];
  if (d.decided_at) parts.push(when(d.decided_at));
  if (d.scope) parts.push(`scope ${d.scope === "run" ? "run (later calls of this tool in this run)" : "once"}`);
  if (d.reason) parts.push(`reason “${d.reason}”`);
  if (d.args_before != null) parts.push(`arguments edited${d.args_edited_by ? ` by ${d.args_edited_by}` : ""}`);
  return parts.join(" · ");
}

// Show the connection state in the header: live, stale, reconnecting, polling…
export function showConnection(state, detail = "") {
  const node = document.getElementById("conn");
  if (!node) return;
  node.hidden = false;
  node.dataset.state = state;
  const text = {
    live: "● Live", stale: "⚠ Not live: no data", reconnecting: "⟳ Reconnecting…",
    polling: "◌ Polling (live stream unavailable)", connecting: "◌ Connecting…",
    closed: "■ Not live (stream closed)", logged_out: "■ Logged out",
  }[state] || state;
  node.textContent = detail ? `${text} ${detail}` : text;
}
