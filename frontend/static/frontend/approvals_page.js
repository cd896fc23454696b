// Approvals inbox. "Pending": every pending approval of the tenant, oldest first,
// live, as cards with the context to decide (the run's input, what the model
// said when it asked, the rule), grouped by agent or tool, decided one at a
// time (mouse or keys j/k, a, d, Enter) or in bulk after a confirmation. A
// one-key decision waits a few seconds with Undo before it is sent: undone,
// nothing was decided. A click on a card's button is sent at once. "Decided": who decided what, when and why.

import { api, rowsOf } from "./api.js";
import { approvalDetails, approvalLabel, decisionSummary, el, statusBadge, timeLeft, when } from "./format.js";
import { Stream, throttle } from "./stream.js";
import { askDenyReason } from "./deny_dialog.js";
import { decisionFailure, diffView, postDecision, sessionExpired, showMessage } from "./decisions.js";

const root = document.getElementById("inbox-root");
const canDecide = root.dataset.canDecide === "1";
const undoMs = Number(root.dataset.undoSeconds || 5) * 1000;
const list = document.getElementById("inbox");
const params = new URLSearchParams(location.search);
let tab = params.get("tab") === "decided" ? "decided" : "pending";
let group = ["agent", "tool"].includes(params.get("group")) ? params.get("group") : "";
let items = []; // in the order shown (groups, then oldest first)
let active = 0;
const busy = new Set();
const selected = new Set();
const scheduled = new Map(); // approval id -> {verb, reason, timer, deadline}
window.cpInbox = { scheduled, undoMs };
const ENDED = new Set(["succeeded", "failed", "unverified", "budget_exhausted", "policy_blocked", "cancelled"]);

// A message with a way out (log in again) stays until followed.
let stickyMessage = false;
function message(text, kind = "error") {
  const value = typeof text === "string" || !text ? (text ? { text } : null) : text;
  if (stickyMessage && !value?.link) return;
  stickyMessage = Boolean(value?.link);
  showMessage(document.getElementById("inbox-error"), value, kind);
}

function groupKey(a) {
  return group === "agent" ? a.agent : group === "tool" ? approvalLabel(a) : "";
}

async function load() {
  try {
    if (tab === "decided") {
      items = rowsOf(await api("/api/v1/approvals/?status=decided&limit=100"));
    } else {
      const rows = rowsOf(await api("/api/v1/approvals/?status=pending&limit=500"))
        // A run that ended has nothing left to decide; an external agent's call
        // waits in its own process, whatever its run says.
        .filter((a) => a.kind === "external_call" || !ENDED.has(a.run_status));
      rows.sort((a, b) => (groupKey(a) < groupKey(b) ? -1 : groupKey(a) > groupKey(b) ? 1 : 0)
        || Date.parse(a.requested_at) - Date.parse(b.requested_at));
      const focusedId = items[active]?.id;
      items = rows;
      for (const id of [...selected]) if (!items.some((a) => a.id === id)) selected.delete(id);
      const keep = items.findIndex((a) => a.id === focusedId);
      active = keep >= 0 ? keep : Math.min(active, Math.max(0, items.length - 1));
    }
    render();
  } catch (error) {
    message(`Could not load approvals: ${error.message}`);
  }
}
const refresh = throttle(load, 300);

function context(a) {
  const parts = [];
  if (a.run_input) parts.push(el("div", { class: "ctx" }, el("span", { class: "ctx-label", text: "Run input" }), el("blockquote", { class: "run-input", text: a.run_input })));
  if (a.last_model_message) parts.push(el("div", { class: "ctx" }, el("span", { class: "ctx-label", text: "The model said" }), el("blockquote", { class: "model-message", text: a.last_model_message })));
  return parts;
}

function pendingCard(a, i) {
  const label = approvalLabel(a);
  const budget = a.kind === "budget_extension";
  const ofRun = !a.tool_call_id; // a question about the run, not one call
  const waiting = scheduled.get(a.id);
  const li = el("li", { class: `inbox-item${i === active ? " active" : ""}${budget ? " budget-extension" : ""}${waiting ? " scheduled" : ""}`, tabindex: i === active ? "0" : "-1", "data-approval": a.id, "data-kind": a.kind,
    "aria-label": `${label} in run ${a.run.slice(0, 8)} of ${a.agent}, requested ${when(a.requested_at)}, ${timeLeft(a.expires_at)}` },
    el("div", { class: "inbox-head" },
      canDecide ? el("input", { type: "checkbox", class: "pick", "aria-label": `Select ${label} in run ${a.run.slice(0, 8)}`, checked: selected.has(a.id), onchange: (e) => { if (e.target.checked) selected.add(a.id); else selected.delete(a.id); renderBulk(); } }) : null,
      el("span", { class: "status s-waiting_approval" }, el("span", { "aria-hidden": "true", text: "‖" }), " pending"),
      el("code", { class: "tool", text: label }),
      el("a", { href: ofRun ? `/runs/${a.run}/` : `/runs/${a.run}/#call=${encodeURIComponent(a.tool_call_id)}`, text: `run ${a.run.slice(0, 8)} → trace` }),
      el("span", { class: "agent-name", text: a.agent }),
      a.parent_run ? el("a", { class: "parent-run", href: `/runs/${a.parent_run}/`, text: `sub-agent of run ${a.parent_run.slice(0, 8)}` }) : null,
      el("span", { class: "muted small", text: `requested ${when(a.requested_at)}` }),
      el("span", { class: "left", "data-expires": a.expires_at, text: timeLeft(a.expires_at) })),
    ...context(a),
    el("p", { class: "rule", text: budget ? "Budget exhausted: the tenant asks before extending it" : `Rule: ${a.rule_reason || a.rule || "–"}${a.approvals_required > 1 ? ` · needs ${a.approvals_required} approvals (${(a.decisions || []).length} so far)` : ""}` }),
    el("pre", { class: "args", tabindex: "0", "aria-label": `Arguments of ${label}`, text: approvalDetails(a) }));
  if (waiting) {
    const verbing = waiting.verb === "approve" ? "Approving" : "Denying";
    li.append(el("div", { class: "undo", role: "status" },
      el("span", { "data-undo-deadline": String(waiting.deadline), text: `${verbing} in ${Math.ceil((waiting.deadline - Date.now()) / 1000)} s…` }),
      el("button", { type: "button", class: "undo-button", "aria-keyshortcuts": "u", text: "Undo", onclick: () => undo(a.id) })));
  } else if (canDecide) {
    li.append(el("div", { class: "buttons" },
      el("button", { type: "button", class: "approve", "aria-label": `Approve ${label}`, "aria-keyshortcuts": "a", text: "✓ Approve", onclick: () => decideOne(i, "approve") }),
      el("button", { type: "button", class: "deny", "aria-label": `Deny ${label}`, "aria-keyshortcuts": "d", text: "✕ Deny", onclick: () => decideOne(i, "deny") })));
  }
  li.addEventListener("focus", () => { active = i; markActive(); });
  return li;
}

function decidedCard(a) {
  const label = approvalLabel(a);
  const summary = decisionSummary({ status: a.status, decided_by: a.decided_by, decided_at: a.decided_at, scope: a.status === "approved" ? a.scope : null, reason: a.reason, args_before: a.original_args, args_edited_by: a.args_edited_by });
  const li = el("li", { class: `inbox-item decided d-${a.status}`, "data-approval": a.id },
    el("div", { class: "inbox-head" }, statusBadge(a.status), el("code", { class: "tool", text: label }),
      el("a", { href: a.tool_call_id ? `/runs/${a.run}/#call=${encodeURIComponent(a.tool_call_id)}` : `/runs/${a.run}/`, text: `run ${a.run.slice(0, 8)} → trace` }),
      el("span", { class: "agent-name", text: a.agent })),
    el("p", { class: "decided-summary", text: summary }),
    el("p", { class: "rule", text: `Rule: ${a.rule_reason || a.rule || "–"} · requested ${when(a.requested_at)}` }));
  if ((a.decisions || []).length > 1) {
    li.append(el("ul", { class: "votes" }, ...a.decisions.map((d) => el("li", { text: `${d.decision} by ${d.user || "–"} ${when(d.created_at)}${d.reason ? `: “${d.reason}”` : ""}` }))));
  }
  if (a.original_args != null) li.append(diffView(a.original_args, a.args, `decided-diff-${a.id}`));
  else if (a.kind === "tool_call") li.append(el("pre", { class: "args", tabindex: "0", "aria-label": `Arguments of ${label}`, text: approvalDetails(a) }));
  return li;
}

function render() {
  const hadFocus = list.contains(document.activeElement);
  const pendingTab = tab === "pending";
  for (const button of document.querySelectorAll("[role=tab]")) {
    const on = button.dataset.tab === tab;
    button.setAttribute("aria-selected", String(on));
    button.tabIndex = on ? 0 : -1;
  }
  document.getElementById("group-by").closest(".inbox-tools").hidden = !pendingTab;
  document.getElementById("inbox-empty").hidden = items.length > 0;
  document.getElementById("inbox-empty").textContent = pendingTab ? "Nothing is waiting for a decision. ✓" : "Nothing has been decided yet.";
  document.getElementById("inbox-count").textContent = pendingTab ? `${items.length} pending` : `${items.length} decided (latest first)`;
  const badge = document.getElementById("nav-pending");
  if (badge && pendingTab) { badge.hidden = !items.length; badge.textContent = String(items.length); }
  const sections = [];
  let current = null;
  items.forEach((a, i) => {
    const key = pendingTab ? groupKey(a) : "";
    if (!current || current.key !== key) {
      const count = items.filter((b) => (pendingTab ? groupKey(b) : "") === key).length;
      current = { key, list: el("ol", { class: "inbox", "aria-label": key ? `${group} ${key}` : pendingTab ? "Pending approvals, oldest first" : "Decided approvals, latest first" }) };
      sections.push(key ? el("section", { class: "inbox-group" }, el("h2", { class: "h3", text: `${group === "agent" ? "Agent" : "Tool"} ${key} · ${count}` }), current.list) : current.list);
    }
    current.list.append(pendingTab ? pendingCard(a, i) : decidedCard(a));
  });
  list.replaceChildren(...sections);
  renderBulk();
  if (hadFocus) focusActive();
}

function cards() {
  return [...list.querySelectorAll("li.inbox-item")];
}

function markActive() {
  cards().forEach((li, i) => { li.classList.toggle("active", i === active); li.tabIndex = i === active ? 0 : -1; });
}

function focusActive() {
  markActive();
  cards()[active]?.focus();
}

// ---- one at a time, with an undo window ------------------------------------------

// A one-key decision (`a`, or `d` and a reason) is held for the undo window; a
// click on a card's button is deliberate and is sent at once.
async function decideOne(index, verb, { byKey = false } = {}) {
  const approval = items[index];
  if (!approval || busy.has(approval.id) || scheduled.has(approval.id)) return;
  let reason = "";
  if (verb === "deny") {
    reason = await askDenyReason(approvalLabel(approval));
    if (reason === null) { focusActive(); return; }
  }
  if (!byKey) { send(approval, verb, reason); return; }
  // Nothing is sent until the window ends; Undo (or leaving the page) drops it.
  const deadline = Date.now() + undoMs;
  const timer = setTimeout(() => { scheduled.delete(approval.id); send(approval, verb, reason); }, undoMs);
  scheduled.set(approval.id, { verb, reason, timer, deadline });
  message({ text: `${verb === "approve" ? "Approving" : "Denying"} ${approvalLabel(approval)} in ${undoMs / 1000} s. Press u or Undo to keep it waiting.` }, "notice");
  render();
  focusActive();
}

function undo(id) {
  const waiting = scheduled.get(id);
  if (!waiting) return;
  clearTimeout(waiting.timer);
  scheduled.delete(id);
  const approval = items.find((a) => a.id === id);
  message({ text: `Undone: nothing was decided on ${approval ? approvalLabel(approval) : "the approval"}; it is still waiting.` }, "notice");
  render();
  focusActive();
}

window.addEventListener("beforeunload", (event) => {
  if (scheduled.size) { event.preventDefault(); event.returnValue = ""; }
});

async function send(approval, verb, reason) {
  busy.add(approval.id);
  try {
    const decided = await postDecision(approval, { decision: verb, reason });
    message(`${decided.status === "pending" ? "Recorded your approval of" : verb === "approve" ? "Approved" : "Denied"} ${approvalLabel(decided)}.`, "notice");
  } catch (error) {
    message(decisionFailure(error, approval, `/approvals/#approval=${approval.id}`));
    if (sessionExpired(error)) { busy.delete(approval.id); render(); return; }
  } finally {
    busy.delete(approval.id);
  }
  items = items.filter((a) => a.id !== approval.id);
  selected.delete(approval.id);
  active = Math.min(active, Math.max(0, items.length - 1));
  render();
  focusActive();
  refresh();
}

// ---- in bulk, after a confirmation -------------------------------------------

function renderBulk() {
  const bar = document.getElementById("bulk-bar");
  if (!bar) return;
  const picked = items.filter((a) => selected.has(a.id));
  bar.hidden = tab !== "pending" || !items.length;
  document.getElementById("bulk-count").textContent = picked.length ? `${picked.length} selected` : "None selected";
  document.getElementById("bulk-approve").disabled = !picked.length;
  document.getElementById("bulk-deny").disabled = !picked.length;
  document.getElementById("bulk-all").textContent = picked.length === items.length ? "Clear selection" : "Select all";
}

function confirmBulk(verb, picked) {
  const dialog = document.getElementById("bulk-dialog");
  const reason = document.getElementById("bulk-reason");
  const error = document.getElementById("bulk-error");
  const counts = new Map();
  for (const a of picked) counts.set(approvalLabel(a), (counts.get(approvalLabel(a)) || 0) + 1);
  document.getElementById("bulk-title").textContent = `${verb === "approve" ? "Approve" : "Deny"} ${picked.length} request${picked.length === 1 ? "" : "s"}?`;
  document.getElementById("bulk-list").replaceChildren(...[...counts].map(([label, n]) => el("li", { text: `${label} × ${n}` })));
  document.getElementById("bulk-reason-field").hidden = verb !== "deny";
  const confirm = document.getElementById("bulk-confirm");
  confirm.textContent = verb === "approve" ? `Approve ${picked.length}` : `Deny ${picked.length}`;
  confirm.className = verb === "approve" ? "approve" : "danger";
  reason.value = "";
  error.textContent = "";
  reason.removeAttribute("aria-invalid");
  return new Promise((resolve) => {
    const form = document.getElementById("bulk-form");
    const finish = (value) => {
      form.onsubmit = null;
      document.getElementById("bulk-cancel").onclick = null;
      dialog.oncancel = null;
      if (dialog.open) dialog.close();
      resolve(value);
    };
    form.onsubmit = (event) => {
      event.preventDefault();
      const text = reason.value.trim();
      if (verb === "deny" && !text) {
        error.textContent = "Say why, so the agents and the audit log know.";
        reason.setAttribute("aria-invalid", "true");
        reason.focus();
        return;
      }
      finish({ reason: text });
    };
    document.getElementById("bulk-cancel").onclick = () => finish(null);
    dialog.oncancel = (event) => { event.preventDefault(); finish(null); };
    dialog.showModal();
    (verb === "deny" ? reason : document.getElementById("bulk-cancel")).focus();
  });
}

async function decideBulk(verb) {
  const picked = items.filter((a) => selected.has(a.id) && !scheduled.has(a.id));
  if (!picked.length) return;
  const answer = await confirmBulk(verb, picked);
  if (answer === null) { message({ text: "Nothing was decided." }, "notice"); return; }
  let done = 0;
  const failed = [];
  for (const approval of picked) {
    try {
      await postDecision(approval, { decision: verb, reason: answer.reason });
      done += 1;
      selected.delete(approval.id);
    } catch (error) {
      failed.push(`${approvalLabel(approval)} (run ${approval.run.slice(0, 8)}): ${decisionFailure(error, approval, "/approvals/").text}`);
      if (sessionExpired(error)) {
        message(decisionFailure(error, approval, "/approvals/"));
        await load();
        return;
      }
    }
  }
  const did = `${verb === "approve" ? "Approved" : "Denied"} ${done} of ${picked.length}.`;
  message({ text: failed.length ? `${did} Not decided: ${failed.join("; ")}` : did }, failed.length ? "error" : "notice");
  await load();
}

// ---- controls ---------------------------------------------------------------------

function setUrl() {
  const next = new URLSearchParams();
  if (tab === "decided") next.set("tab", "decided");
  if (group) next.set("group", group);
  history.replaceState(null, "", `${location.pathname}${next.size ? `?${next}` : ""}${location.hash}`);
}

for (const button of document.querySelectorAll("[role=tab]")) {
  button.addEventListener("click", () => { tab = button.dataset.tab; items = []; active = 0; setUrl(); load(); });
}
const groupBy = document.getElementById("group-by");
groupBy.value = group;
groupBy.addEventListener("change", () => { group = groupBy.value; setUrl(); load(); });
if (canDecide) {
  document.getElementById("bulk-approve").addEventListener("click", () => decideBulk("approve"));
  document.getElementById("bulk-deny").addEventListener("click", () => decideBulk("deny"));
  document.getElementById("bulk-all").addEventListener("click", () => {
    if (selected.size === items.length) selected.clear(); else items.forEach((a) => selected.add(a.id));
    render();
  });
}

document.addEventListener("keydown", (event) => {
  if (event.target.closest("input, textarea, select, dialog") || event.ctrlKey || event.metaKey || event.altKey) return;
  if (tab !== "pending") return;
  const key = event.key;
  if (key === "j" || key === "ArrowDown") { active = Math.min(items.length - 1, active + 1); focusActive(); }
  else if (key === "k" || key === "ArrowUp") { active = Math.max(0, active - 1); focusActive(); }
  else if (key === "a" && canDecide) decideOne(active, "approve", { byKey: true });
  else if (key === "d" && canDecide) decideOne(active, "deny", { byKey: true });
  else if (key === "u" && canDecide && items[active]) undo(items[active].id);
  else if (key === "x" && canDecide && items[active]) {
    const id = items[active].id;
    if (selected.has(id)) selected.delete(id); else selected.add(id);
    render();
  } else if (key === "Enter" && event.target.tagName !== "BUTTON" && event.target.tagName !== "A") {
    const link = cards()[active]?.querySelector("a");
    if (link) link.click();
  } else return;
  event.preventDefault();
});

setInterval(() => {
  for (const n of document.querySelectorAll("[data-expires]")) n.textContent = timeLeft(n.dataset.expires);
  for (const n of document.querySelectorAll("[data-undo-deadline]")) {
    const left = Math.max(0, Math.ceil((Number(n.dataset.undoDeadline) - Date.now()) / 1000));
    n.textContent = n.textContent.replace(/in \d+ s/, `in ${left} s`);
  }
}, 500);

await load();
// Back from logging in again: the decision the person was making.
const back = new URLSearchParams(location.hash.slice(1)).get("approval");
if (back) {
  const index = items.findIndex((a) => a.id === back);
  if (index >= 0) { active = index; focusActive(); cards()[index].scrollIntoView({ block: "center" }); }
}
new Stream({
  path: "/ws/tenant/",
  cursorParam: "after_id",
  cursorOf: (event) => event.id,
  onEvent: (event) => {
    const type = event.type || "";
    if (type.startsWith("approval.")) refresh();
    if (type.startsWith("question.")) window.dispatchEvent(new CustomEvent("questions:changed"));
    // reviews_panel.js keeps the "Flagged for review" list on this one stream.
    if (type.startsWith("run.review_")) window.dispatchEvent(new CustomEvent("reviews:changed"));
  },
  onResync: () => {
    refresh();
    window.dispatchEvent(new CustomEvent("reviews:changed"));
    window.dispatchEvent(new CustomEvent("questions:changed"));
  },
  poll: async () => { await load(); return []; },
}).start();
