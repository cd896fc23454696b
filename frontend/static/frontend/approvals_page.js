// Approvals inbox: every pending approval of the tenant, oldest first, live;
// decide from the list with the mouse or the keyboard (j/k, a, d, Enter).

import { api, ApiError, rowsOf } from "./api.js";
import { approvalDetails, approvalLabel, el, timeLeft, when } from "./format.js";
import { Stream, throttle } from "./stream.js";
import { askDenyReason } from "./deny_dialog.js";

const root = document.getElementById("inbox-root");
const canDecide = root.dataset.canDecide === "1";
const list = document.getElementById("inbox");
let items = [];
let active = 0;
const busy = new Set();

function message(text, kind = "error") {
  const box = document.getElementById("inbox-error");
  box.hidden = !text;
  box.className = kind;
  box.textContent = text || "";
}

async function load() {
  try {
    const rows = rowsOf(await api("/api/v1/approvals/?status=pending&limit=500"));
    rows.sort((a, b) => Date.parse(a.requested_at) - Date.parse(b.requested_at));
    // A request whose run already ended has nothing left to decide.
    const ended = new Set(["succeeded", "failed", "unverified", "budget_exhausted", "policy_blocked", "cancelled"]);
    // An external agent's call waits in its own process, whatever its run says.
    rows.splice(0, rows.length, ...rows.filter((a) => a.kind === "external_call" || !ended.has(a.run_status)));
    const focusedId = items[active]?.id;
    items = rows;
    const keep = items.findIndex((a) => a.id === focusedId);
    active = keep >= 0 ? keep : Math.min(active, Math.max(0, items.length - 1));
    render();
  } catch (error) {
    message(`Could not load approvals: ${error.message}`);
  }
}
const refresh = throttle(load, 300);

function render() {
  const hadFocus = list.contains(document.activeElement);
  document.getElementById("inbox-empty").hidden = items.length > 0;
  document.getElementById("inbox-count").textContent = `${items.length} pending`;
  const badge = document.getElementById("nav-pending");
  if (badge) { badge.hidden = !items.length; badge.textContent = String(items.length); }
  list.replaceChildren(...items.map((a, i) => {
    const label = approvalLabel(a);
    const budget = a.kind === "budget_extension";
    const ofRun = !a.tool_call_id; // a question about the run, not one call
    const li = el("li", { class: `inbox-item${i === active ? " active" : ""}${budget ? " budget-extension" : ""}`, tabindex: i === active ? "0" : "-1", "data-approval": a.id, "data-kind": a.kind,
      "aria-label": `${label} in run ${a.run.slice(0, 8)}, requested ${when(a.requested_at)}, ${timeLeft(a.expires_at)}` },
      el("div", { class: "inbox-head" },
        el("span", { class: "status s-waiting_approval" }, el("span", { "aria-hidden": "true", text: "‖" }), " pending"),
        el("code", { class: "tool", text: label }),
        el("a", { href: ofRun ? `/runs/${a.run}/` : `/runs/${a.run}/#call=${encodeURIComponent(a.tool_call_id)}`, text: `run ${a.run.slice(0, 8)} → trace` }),
        el("span", { class: "muted small", text: `requested ${when(a.requested_at)}` }),
        el("span", { class: "left", "data-expires": a.expires_at, text: timeLeft(a.expires_at) })),
      el("p", { class: "rule", text: budget ? "Budget exhausted: the tenant asks before extending it" : `Rule: ${a.rule_reason || a.rule || "–"}${a.approvals_required > 1 ? ` · needs ${a.approvals_required} approvals (${(a.decisions || []).length} so far)` : ""}` }),
      el("pre", { class: "args", text: approvalDetails(a) }),
    );
    if (canDecide) {
      li.append(el("div", { class: "buttons" },
        el("button", { type: "button", class: "approve", "aria-label": `Approve ${label}`, "aria-keyshortcuts": "a", text: "✓ Approve", onclick: () => decide(i, "approve") }),
        el("button", { type: "button", class: "deny", "aria-label": `Deny ${label}`, "aria-keyshortcuts": "d", text: "✕ Deny", onclick: () => decide(i, "deny") })));
    }
    li.addEventListener("focus", () => { active = i; markActive(); });
    return li;
  }));
  if (hadFocus) focusActive();
}

function markActive() {
  [...list.children].forEach((li, i) => { li.classList.toggle("active", i === active); li.tabIndex = i === active ? 0 : -1; });
}

function focusActive() {
  markActive();
  list.children[active]?.focus();
}

async function decide(index, verb) {
  const approval = items[index];
  if (!approval || busy.has(approval.id)) return;
  let reason = "";
  if (verb === "deny") {
    reason = await askDenyReason(approvalLabel(approval));
    if (reason === null) { focusActive(); return; }
  }
  busy.add(approval.id);
  try {
    const decided = await api(`/api/v1/approvals/${approval.id}/decide/`, { method: "POST", body: { decision: verb, reason } });
    message(`${decided.status === "pending" ? "Recorded your approval of" : verb === "approve" ? "Approved" : "Denied"} ${approvalLabel(decided)}.`, "notice");
  } catch (error) {
    if (error instanceof ApiError && error.status === 409) {
      const current = error.body?.error?.approval;
      message(`Already decided: ${current ? `${current.status}${current.decided_by ? ` by ${current.decided_by}` : ""}` : error.message}.`);
    } else {
      message(`The decision failed: ${error.message}`);
    }
  } finally {
    busy.delete(approval.id);
  }
  items = items.filter((a) => a.id !== approval.id);
  active = Math.min(active, Math.max(0, items.length - 1));
  render();
  focusActive();
  refresh();
}

document.addEventListener("keydown", (event) => {
  if (event.target.closest("input, textarea, select, dialog") || event.ctrlKey || event.metaKey || event.altKey) return;
  const key = event.key;
  if (key === "j" || key === "ArrowDown") { active = Math.min(items.length - 1, active + 1); focusActive(); }
  else if (key === "k" || key === "ArrowUp") { active = Math.max(0, active - 1); focusActive(); }
  else if (key === "a" && canDecide) decide(active, "approve");
  else if (key === "d" && canDecide) decide(active, "deny");
  else if (key === "Enter" && event.target.tagName !== "BUTTON" && event.target.tagName !== "A") {
    const link = list.children[active]?.querySelector("a");
    if (link) link.click();
  } else return;
  event.preventDefault();
});

setInterval(() => { for (const n of document.querySelectorAll("[data-expires]")) n.textContent = timeLeft(n.dataset.expires); }, 1000);

await load();
new Stream({
  path: "/ws/tenant/",
  cursorParam: "after_id",
  cursorOf: (event) => event.id,
  onEvent: (event) => { if ((event.type || "").startsWith("approval.")) refresh(); },
  onResync: refresh,
  poll: async () => { await load(); return []; },
}).start();
