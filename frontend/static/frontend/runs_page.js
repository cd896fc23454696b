// Runs list: live status (tenant stream → refetch), filters, start a run.

import { api, rowsOf, showFieldErrors } from "./api.js";
import { duration, el, money, since, statusBadge, tokens, TERMINAL_RUN } from "./format.js";
import { Stream, throttle } from "./stream.js";

const PAGE = 50;
const body = document.getElementById("runs-body");
const filters = document.getElementById("filters");
const moreButton = document.getElementById("runs-more");
let limit = PAGE;
let runs = [];
let pendingByRun = new Map();
let total = 0;
let loadedAt = null; // when the rows shown were fetched

async function loadAgents() {
  let agents = [];
  try { agents = rowsOf(await api("/api/v1/agents/")); } catch { /* the list still works */ }
  const agentFilter = document.getElementById("f-agent");
  const startAgent = document.getElementById("start-agent");
  for (const a of agents) agentFilter.append(el("option", { value: a.slug, text: a.slug }));
  if (startAgent) {
    // Only agents a run may start from: enabled, and run here (a version).
    const startable = agents.filter((a) => !a.disabled && a.version != null);
    startAgent.replaceChildren(el("option", { value: "", text: startable.length ? "Choose an agent" : "No agents to run in this tenant" }));
    for (const a of startable) startAgent.append(el("option", { value: a.slug, text: a.name ? `${a.name} (${a.slug} v${a.version})` : a.slug }));
    if (startable.length === 1) startAgent.value = startable[0].slug;
  }
}

async function load() {
  const params = new URLSearchParams({ limit: String(limit) });
  const status = document.getElementById("f-status").value;
  const agent = document.getElementById("f-agent").value;
  if (status) params.set("status", status);
  if (agent) params.set("agent", agent);
  try {
    const [page, approvals] = await Promise.all([
      api(`/api/v1/runs/?${params}`),
      api("/api/v1/approvals/?status=pending&limit=500").catch(() => null),
    ]);
    runs = rowsOf(page);
    total = page.count ?? runs.length;
    pendingByRun = new Map();
    for (const a of rowsOf(approvals)) pendingByRun.set(a.run, (pendingByRun.get(a.run) || 0) + 1);
    const badge = document.getElementById("nav-pending");
    const pending = rowsOf(approvals).length;
    if (badge) { badge.hidden = !pending; badge.textContent = String(pending); }
    loadedAt = new Date();
    showStale(null);
    render();
  } catch (error) {
    // A failed refresh keeps the rows a person was reading, marked as stale.
    if (loadedAt) showStale(error);
    else body.replaceChildren(el("tr", {}, el("td", { colspan: 9, class: "error", text: `Could not load runs: ${error.message}` })));
  }
}

function showStale(error) {
  const note = document.getElementById("runs-stale");
  document.getElementById("runs-table").dataset.stale = error ? "1" : "";
  note.hidden = !error;
  note.textContent = error
    ? `⚠ Not up to date: the list could not be refreshed (${error.message}). Showing the runs as of ${loadedAt.toLocaleTimeString()}.`
    : "";
}

function matches(run, text) {
  if (!text) return true;
  const hay = `${run.id} ${run.agent} ${run.input} ${run.started_by || ""} ${run.status} ${run.final_answer || ""}`.toLowerCase();
  return text.toLowerCase().split(/\s+/).every((word) => hay.includes(word));
}

function render() {
  const text = document.getElementById("f-text").value.trim();
  const shown = runs.filter((r) => matches(r, text));
  if (!shown.length) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: 9, class: "muted", text: runs.length ? "No run matches the filter." : "No runs yet." })));
  } else {
    body.replaceChildren(...shown.map(row));
  }
  moreButton.hidden = runs.length >= total;
  document.getElementById("runs-count").textContent = `${shown.length} shown of ${total}`;
}

function row(run) {
  const waiting = pendingByRun.get(run.id) || 0;
  const end = run.finished_at || (TERMINAL_RUN.has(run.status) ? run.started_at : null);
  const tr = el("tr", { "data-run": run.id, "data-status": run.status },
    el("td", {}, statusBadge(run.status)),
    el("td", {}, el("a", { href: `/runs/${run.id}/`, class: "run-link" },
      el("code", { text: run.id.slice(0, 8) }), " ", el("span", { class: "input-preview", text: (run.input || "").slice(0, 80) }))),
    el("td", { text: run.agent }),
    el("td", { text: run.started_by || "–" }),
    el("td", { class: "num", "data-started": run.started_at || "", "data-finished": end || "", text: duration(since(run.started_at, end)) }),
    el("td", { class: "num", text: String(run.steps) }),
    el("td", { class: "num", text: tokens((run.input_tokens || 0) + (run.output_tokens || 0)) }),
    el("td", { class: "num", text: money(run.cost) }),
    el("td", {}, waiting ? el("a", { class: "waiting", href: `/runs/${run.id}/` , text: `‖ ${waiting} waiting` }) : el("span", { class: "muted", text: "–" })),
  );
  return tr;
}

// Running durations tick without a refetch.
setInterval(() => {
  for (const cell of body.querySelectorAll("td[data-started]")) {
    if (cell.dataset.started && !cell.dataset.finished) cell.textContent = duration(since(cell.dataset.started));
  }
}, 1000);

const refresh = throttle(load, 500);
// Status changes of runs in view arrive on the tenant stream; a slow poll while
// any is unfinished covers events that stream does not carry.
setInterval(() => { if (runs.some((r) => !TERMINAL_RUN.has(r.status))) refresh(); }, 3000);
filters.addEventListener("change", () => { limit = PAGE; load(); });
document.getElementById("f-text").addEventListener("input", render);
filters.addEventListener("submit", (e) => e.preventDefault());
moreButton.addEventListener("click", () => { limit += PAGE; load(); });

const form = document.getElementById("start-form");
if (form) {
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const submit = document.getElementById("start-submit");
    const agent = document.getElementById("start-agent").value;
    const input = document.getElementById("start-input").value;
    showFieldErrors("start", null);
    // Server validation is the authority; these only save a round trip.
    const local = {};
    if (!agent) local.agent = ["Choose an agent."];
    if (!input.trim()) local.input = ["Say what the agent should do."];
    if (Object.keys(local).length) { showFieldErrors("start", { fields: local }, "start-form-error"); return; }
    submit.disabled = true;
    try {
      const run = await api("/api/v1/runs/", { method: "POST", body: { agent, input } });
      document.getElementById("start-input").value = "";
      runs = [run, ...runs.filter((r) => r.id !== run.id)];
      total += 1;
      render();
      refresh();
    } catch (error) {
      showFieldErrors("start", error, "start-form-error");
    } finally {
      submit.disabled = false;
    }
  });
}

await loadAgents();
await load();
new Stream({
  path: "/ws/tenant/",
  cursorParam: "after_id",
  cursorOf: (event) => event.id,
  onEvent: refresh,
  onResync: refresh,
  poll: async () => { await load(); return []; },
}).start();
