// Runs list: filters, search and sort kept in the URL (reload and back/forward
// restore them), all applied by the server (GET /api/v1/runs/ takes the same
// names); a column chooser remembered per browser; live status (tenant stream →
// refetch with the same filters); start a run.

import { api, rowsOf, showFieldErrors } from "./api.js";
import { duration, el, money, since, statusBadge, tokens, when, TERMINAL_RUN } from "./format.js";
import { Stream, throttle } from "./stream.js";

const PAGE = 50;
// The URL's query names, agreed with the overview's click-through (INTERFACES.md).
const FILTERS = ["status", "agent", "tool", "end_user", "from", "to", "cost_gt", "has_error", "waiting", "q"];
const DEFAULT_SORT = "-created_at";
const COLUMNS_KEY = "controlplane.runs.columns";
const WAITING_WORDS = { approval: "approval", input: "input", budget: "budget extension" };

const body = document.getElementById("runs-body");
const head = document.getElementById("runs-head");
const filters = document.getElementById("filters");
const moreButton = document.getElementById("runs-more");
const field = (name) => document.getElementById(`f-${name}`);

// Each column: what its header says, the server's sort name (text columns sort
// A→Z first, figures and times largest/newest first) and its cell.
const COLUMNS = [
  { key: "status", label: "Status", sort: "status", asc: true, cell: (r) => statusBadge(r.status) },
  { key: "run", label: "Run", fixed: true, cell: (r) => el("a", { href: `/runs/${r.id}/`, class: "run-link" },
    el("code", { text: r.id.slice(0, 8) }), " ", el("span", { class: "input-preview", text: (r.input || "").slice(0, 80) })) },
  { key: "agent", label: "Agent", sort: "agent", asc: true, cell: (r) => r.agent },
  { key: "started_by", label: "Started by", sort: "started_by", asc: true, cell: (r) => r.started_by || "–" },
  { key: "created", label: "Created", sort: "created_at", cell: (r) => el("time", { datetime: r.created_at, text: when(r.created_at) }) },
  { key: "finished", label: "Finished", sort: "finished_at", hidden: true, cell: (r) => (r.finished_at ? el("time", { datetime: r.finished_at, text: when(r.finished_at) }) : "–") },
  { key: "duration", label: "Duration", sort: "duration", num: true, cell: durationCell },
  { key: "steps", label: "Steps", sort: "steps", num: true, cell: (r) => String(r.steps) },
  { key: "tool_calls", label: "Tool calls", sort: "tool_calls", num: true, hidden: true, cell: (r) => String(r.tool_calls) },
  { key: "tokens", label: "Tokens", sort: "tokens", num: true, cell: (r) => tokens((r.input_tokens || 0) + (r.output_tokens || 0)) },
  { key: "cost", label: "Cost", sort: "cost", num: true, cell: (r) => money(r.cost) },
  { key: "waiting", label: "Waiting on", sort: "waiting", cell: waitingCell },
  { key: "answer", label: "Final answer", hidden: true, cell: (r) => el("span", { class: "answer-preview", text: (r.final_answer || "–").slice(0, 120) }) },
];

let limit = PAGE;
let runs = [];
let total = 0;
let loadedAt = null; // when the rows shown were fetched
let failed = false; // the last read was refused (a bad filter): nothing to keep
let loadSeq = 0; // only the newest read may draw
let visible = loadColumns();

// ---- The URL is the list's state ------------------------------------------

function stateFromUrl() {
  const params = new URLSearchParams(location.search);
  const state = {};
  for (const name of FILTERS) state[name] = params.get(name) || "";
  state.sort = params.get("sort") || "";
  return state;
}

function urlOf(state) {
  const params = new URLSearchParams();
  for (const name of [...FILTERS, "sort"]) if (state[name]) params.set(name, state[name]);
  const query = params.toString();
  return `${location.pathname}${query ? `?${query}` : ""}`;
}

function navigate(state) {
  const url = urlOf(state);
  if (url !== `${location.pathname}${location.search}`) history.pushState(null, "", url);
  limit = PAGE;
  load();
}

// datetime-local shows local time; the URL holds an ISO instant (UTC).
function localInputOf(iso) {
  const date = new Date(iso);
  if (!iso || Number.isNaN(date.getTime())) return "";
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

function isoOf(local) {
  const date = new Date(local);
  return local && !Number.isNaN(date.getTime()) ? date.toISOString().replace(/\.000Z$/, "Z") : "";
}

function ensureOption(select, value) {
  // A value the select does not offer (a deleted agent, a typo in a link) is
  // shown as it is, so the server's message next to it makes sense.
  if (value && ![...select.options].some((o) => o.value === value)) select.append(el("option", { value, text: value }));
}

function showState(state, { live = false } = {}) {
  for (const name of ["status", "agent", "has_error", "waiting"]) {
    ensureOption(field(name), state[name]);
    field(name).value = state[name];
  }
  for (const name of ["from", "to"]) {
    const input = field(name);
    // Keep what the URL said when it is not a time the input can show.
    input.dataset.raw = state[name];
    input.value = localInputOf(state[name]);
  }
  field("cost_gt").value = state.cost_gt;
  // A live refresh must not overwrite a tool name being typed; the search box
  // applies itself while typed, so what it holds is always the newer.
  for (const name of ["tool", "end_user"]) {
    if (!live || document.activeElement !== field(name)) field(name).value = state[name];
  }
  if (document.activeElement !== field("q")) field("q").value = state.q;
}

function stateFromForm() {
  const state = { sort: stateFromUrl().sort };
  for (const name of ["status", "agent", "tool", "end_user", "has_error", "waiting", "cost_gt"]) state[name] = field(name).value.trim();
  for (const name of ["from", "to"]) {
    const input = field(name);
    // Untouched, the URL's own value stays (the input shows minutes only).
    if (input.value && input.value === localInputOf(input.dataset.raw)) state[name] = input.dataset.raw;
    else state[name] = input.value ? isoOf(input.value) : "";
  }
  state.q = field("q").value.trim();
  return state;
}

// ---- Reading and drawing ------------------------------------------------------

async function loadAgents() {
  let agents = [];
  try { agents = rowsOf(await api("/api/v1/agents/")); } catch { /* the list still works */ }
  const startAgent = document.getElementById("start-agent");
  for (const a of agents) field("agent").append(el("option", { value: a.slug, text: a.slug }));
  if (startAgent) {
    // Only agents a run may start from: enabled, and run here (a version).
    const startable = agents.filter((a) => !a.disabled && a.version != null);
    startAgent.replaceChildren(el("option", { value: "", text: startable.length ? "Choose an agent" : "No agents to run in this tenant" }));
    for (const a of startable) startAgent.append(el("option", { value: a.slug, text: a.name ? `${a.name} (${a.slug} v${a.version})` : a.slug }));
    if (startable.length === 1) startAgent.value = startable[0].slug;
  }
}

async function load({ live = false } = {}) {
  const state = stateFromUrl();
  showState(state, { live });
  const params = new URLSearchParams({ limit: String(limit) });
  for (const name of [...FILTERS, "sort"]) if (state[name]) params.set(name, state[name]);
  const seq = ++loadSeq;
  try {
    const [page, approvals] = await Promise.all([
      api(`/api/v1/runs/?${params}`),
      api("/api/v1/approvals/?status=pending&limit=1").catch(() => null),
    ]);
    if (seq !== loadSeq) return;
    const before = new Set(runs.map((r) => r.id));
    const next = rowsOf(page);
    noteLeavers(live ? [...before].filter((id) => !next.some((r) => r.id === id)).length : 0);
    runs = next;
    total = page.count ?? runs.length;
    const badge = document.getElementById("nav-pending");
    const pending = approvals ? (approvals.count ?? rowsOf(approvals).length) : 0;
    if (badge && approvals) { badge.hidden = !pending; badge.textContent = String(pending); }
    loadedAt = new Date();
    failed = false;
    showFieldErrors("f", null);
    showError(null);
    showStale(null);
    render();
  } catch (error) {
    if (seq !== loadSeq) return;
    if (error.status === 400) {
      // A filter the server refused (typed, or from a link): say which, at it.
      failed = true;
      runs = [];
      total = 0;
      showFieldErrors("f", error);
      showError(error);
      showStale(null);
      render();
    } else if (loadedAt && !failed) {
      // A failed refresh keeps the rows a person was reading, marked as stale.
      showStale(error);
    } else {
      showError(error);
    }
  }
}

const LABELS = { status: "Status", agent: "Agent", tool: "Tool called", end_user: "End user", from: "Created from", to: "Created before", cost_gt: "Cost above",
  has_error: "Errors", waiting: "Waiting on", q: "Search", sort: "Sort", limit: "Page size", offset: "Page" };

function showError(error) {
  const note = document.getElementById("runs-error");
  note.hidden = !error;
  if (!error) { note.textContent = ""; return; }
  const fields = Object.entries(error.fields || {});
  note.textContent = fields.length
    ? `These filters cannot be applied: ${fields.map(([name, messages]) => `${LABELS[name] || name}: ${[].concat(messages).join(" ")}`).join("; ")}. Change or clear them.`
    : `Could not load runs: ${error.message}`;
}

function showStale(error) {
  const note = document.getElementById("runs-stale");
  document.getElementById("runs-table").dataset.stale = error ? "1" : "";
  note.hidden = !error;
  note.textContent = error
    ? `⚠ Not up to date: the list could not be refreshed (${error.message}). Showing the runs as of ${loadedAt.toLocaleTimeString()}.`
    : "";
}

// A run that stopped matching the filters (it finished, its approval was
// decided) leaves the list on the next live read; say so, or it just vanishes.
function noteLeavers(count) {
  const note = document.getElementById("runs-left");
  if (!count) return;
  note.textContent = `${count} run${count === 1 ? "" : "s"} left the list at ${new Date().toLocaleTimeString()}: no longer matching the filters.`;
}

function anyFilter(state) {
  return FILTERS.some((name) => state[name]);
}

function render() {
  const state = stateFromUrl();
  const shown = COLUMNS.filter((c) => c.fixed || visible.has(c.key));
  renderHead(shown, state.sort || DEFAULT_SORT);
  if (!runs.length) {
    const text = failed ? "No runs shown: a filter above cannot be applied." : anyFilter(state) ? "No run matches the filters." : "No runs yet.";
    body.replaceChildren(el("tr", {}, el("td", { colspan: shown.length, class: "muted", text })));
  } else {
    body.replaceChildren(...runs.map((run) => el("tr", { "data-run": run.id, "data-status": run.status },
      ...shown.map((c) => el("td", { class: c.num ? "num" : null, "data-col": c.key }, cellOf(c, run))))));
  }
  moreButton.hidden = runs.length >= total;
  document.getElementById("runs-count").textContent = `${runs.length} shown of ${total}`;
}

function cellOf(column, run) {
  const value = column.cell(run);
  return typeof value === "string" ? document.createTextNode(value) : value;
}

function renderHead(shown, sort) {
  const current = sort.replace(/^-/, "");
  const descending = sort.startsWith("-");
  head.replaceChildren(...shown.map((c) => {
    const th = el("th", { scope: "col", class: c.num ? "num" : null, "data-col": c.key });
    if (!c.sort) { th.textContent = c.label; return th; }
    const active = c.sort === current;
    if (active) th.setAttribute("aria-sort", descending ? "descending" : "ascending");
    th.append(el("button", { type: "button", class: "sort", "data-sort": c.sort, onclick: () => sortBy(c) },
      c.label, el("span", { "aria-hidden": "true", class: "sort-mark", text: active ? (descending ? " ▼" : " ▲") : "" })));
    return th;
  }));
  document.getElementById("runs-caption").textContent =
    `Runs, sorted by ${(COLUMNS.find((c) => c.sort === current) || COLUMNS[4]).label.toLowerCase()}, ${descending ? "descending" : "ascending"}`;
}

function sortBy(column) {
  const state = stateFromUrl();
  const sort = state.sort || DEFAULT_SORT;
  const next = sort.replace(/^-/, "") === column.sort
    ? (sort.startsWith("-") ? column.sort : `-${column.sort}`)
    : (column.asc ? column.sort : `-${column.sort}`);
  state.sort = next === DEFAULT_SORT ? "" : next;
  navigate(state);
}

function durationCell(run) {
  const end = run.finished_at || (TERMINAL_RUN.has(run.status) ? run.started_at : null);
  return el("span", { "data-started": run.started_at || "", "data-finished": end || "", text: duration(since(run.started_at, end)) });
}

function waitingCell(run) {
  const waits = Object.entries(run.waiting_on || {}).filter(([, n]) => n > 0);
  if (!waits.length) return el("span", { class: "muted", text: "–" });
  return el("a", { class: "waiting", href: `/runs/${run.id}/`,
    text: `‖ ${waits.map(([who, n]) => (n > 1 ? `${n} ${WAITING_WORDS[who]}s` : WAITING_WORDS[who])).join(", ")}` });
}

// ---- Column chooser (this browser remembers it) ---------------------------------

function loadColumns() {
  const chosen = COLUMNS.filter((c) => !c.hidden).map((c) => c.key);
  try {
    const saved = JSON.parse(localStorage.getItem(COLUMNS_KEY) || "null");
    if (Array.isArray(saved)) return new Set(saved.filter((key) => COLUMNS.some((c) => c.key === key)));
  } catch { /* a damaged entry: the defaults */ }
  return new Set(chosen);
}

function drawColumnChooser() {
  const box = document.getElementById("column-options");
  for (const c of COLUMNS.filter((col) => !col.fixed)) {
    const id = `col-${c.key}`;
    const input = el("input", { type: "checkbox", id, checked: visible.has(c.key) });
    input.addEventListener("change", () => {
      if (input.checked) visible.add(c.key); else visible.delete(c.key);
      try { localStorage.setItem(COLUMNS_KEY, JSON.stringify([...visible])); } catch { /* private mode: this page only */ }
      render();
    });
    box.append(el("div", { class: "column-option" }, input, el("label", { for: id, text: c.label })));
  }
}

// ---- Wiring ------------------------------------------------------------------------

// Running durations tick without a refetch.
setInterval(() => {
  for (const cell of body.querySelectorAll("[data-started]")) {
    if (cell.dataset.started && !cell.dataset.finished) cell.textContent = duration(since(cell.dataset.started));
  }
}, 1000);

const refresh = throttle(() => load({ live: true }), 500);
// Status changes of runs in view arrive on the tenant stream; a slow poll while
// any is unfinished covers events that stream does not carry.
setInterval(() => { if (runs.some((r) => !TERMINAL_RUN.has(r.status))) refresh(); }, 3000);
filters.addEventListener("change", (event) => {
  if (event.target === field("q")) return; // typed: applied by the debounce below
  navigate(stateFromForm());
});
// The text boxes' clear button fires "search", not "change" (typing and Enter
// are the form's change and submit).
for (const name of ["tool", "end_user"]) {
  field(name).addEventListener("search", () => {
    if (!field(name).value && stateFromUrl()[name]) navigate(stateFromForm());
  });
}
let typing = null;
field("q").addEventListener("input", () => {
  clearTimeout(typing);
  typing = setTimeout(() => navigate(stateFromForm()), 300);
});
filters.addEventListener("submit", (event) => { event.preventDefault(); clearTimeout(typing); navigate(stateFromForm()); });
document.getElementById("f-clear").addEventListener("click", () => {
  clearTimeout(typing);
  field("q").value = "";
  navigate({ sort: stateFromUrl().sort });
});
window.addEventListener("popstate", () => { limit = PAGE; load(); });
moreButton.addEventListener("click", () => { limit += PAGE; load(); });

const form = document.getElementById("start-form");
if (form) {
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const submit = document.getElementById("start-submit");
    const agent = document.getElementById("start-agent").value;
    const input = document.getElementById("start-input").value;
    const endUser = document.getElementById("start-end_user").value.trim();
    showFieldErrors("start", null);
    // Server validation is the authority; these only save a round trip.
    const local = {};
    if (!agent) local.agent = ["Choose an agent."];
    if (!input.trim()) local.input = ["Say what the agent should do."];
    if (Object.keys(local).length) { showFieldErrors("start", { fields: local }, "start-form-error"); return; }
    submit.disabled = true;
    try {
      const body = endUser ? { agent, input, end_user: endUser } : { agent, input };
      await api("/api/v1/runs/", { method: "POST", body });
      document.getElementById("start-input").value = "";
      // The new run shows if it matches the filters in view.
      await load();
    } catch (error) {
      showFieldErrors("start", error, "start-form-error");
    } finally {
      submit.disabled = false;
    }
  });
}

drawColumnChooser();
await loadAgents();
await load();
new Stream({
  path: "/ws/tenant/",
  cursorParam: "after_id",
  cursorOf: (event) => event.id,
  onEvent: refresh,
  onResync: refresh,
  poll: async () => { await load({ live: true }); return []; },
}).start();
