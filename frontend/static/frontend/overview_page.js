// Overview: the tenant at a glance over a period (24 h / 7 d / 30 d, kept in
// the URL): runs per bucket by status, p50/p95 duration, approvals waiting and
// the median time to a decision, spend against each budget with a forecast,
// top agents and tools. Every chart and figure links to the runs list filtered
// to what it counts (/runs/?status=&agent=&tool=&from=&to=, INTERFACES.md).
// Live: the tenant stream's events (runs, steps, approvals) and a 30 s timer
// refetch the figures, throttled; charts redraw in place.

import { api } from "./api.js";
import { duration, el, money, patchChildren, statusParts } from "./format.js";
import { Stream, throttle } from "./stream.js";
import { STATUS_COLOURS, timeChart } from "./charts.js";
import { burnChart } from "./burn.js";

const RANGES = { "24h": 24 * 3600e3, "7d": 7 * 86400e3, "30d": 30 * 86400e3 };
const STEP_MS = { hour: 3600e3, day: 86400e3 };
const REFRESH_MS = 30_000;
const params = new URLSearchParams(location.search);
let range = RANGES[params.get("range")] ? params.get("range") : "24h";
let data = null;
let charts = {};
let shape = "";

const runsLink = (filters) => {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(filters)) if (v != null && v !== "") q.set(k, v);
  return `/runs/?${q}`;
};
const iso = (ms) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, "Z");
const periodOf = () => ({ from: data.from.replace(/\.\d+/, ""), to: data.to.replace(/\.\d+/, "") });
const bucketWindow = (i) => {
  const start = new Date(data.buckets[i]).getTime();
  return { from: iso(start), to: iso(start + STEP_MS[data.step]) };
};
const go = (href) => { location.href = href; };
const ms = (v) => (v == null ? "–" : duration(v));

function tile(label, figure, href, testid) {
  return el("a", { class: "tile", href, "data-testid": testid },
    el("span", { class: "figure", text: figure }), el("span", { class: "label", text: label }));
}

function renderTiles() {
  const r = data.runs;
  const a = data.approvals;
  const failed = r.totals.failed || 0;
  patchChildren(document.getElementById("tiles"),
    tile("runs", r.total.toLocaleString(), runsLink(periodOf()), "tile-runs"),
    tile("failed", failed.toLocaleString(), runsLink({ status: "failed", ...periodOf() }), "tile-failed"),
    tile("p50 duration", ms(data.duration.p50_ms), runsLink({ ...periodOf(), sort: "-duration" }), "tile-p50"),
    tile("p95 duration", ms(data.duration.p95_ms), runsLink({ ...periodOf(), sort: "-duration" }), "tile-p95"),
    tile("approvals waiting", a.waiting.toLocaleString(), runsLink({ waiting: "approval" }), "tile-waiting"),
    tile("median time to decision", ms(a.median_decision_ms), "/approvals/", "tile-decision"),
  );
}

function runsSeries() {
  // Statuses that occur in the period, in the model's order.
  return Object.entries(data.runs.by_status).filter(([, v]) => v.some(Boolean))
    .map(([status, values]) => ({ status, label: statusParts(status)[1], colour: STATUS_COLOURS[status], values }));
}

function chartsShape() {
  return JSON.stringify([data.buckets.length, data.step, runsSeries().map((s) => s.status), Object.keys(data.budgets.periods)]);
}

function drawCharts() {
  for (const c of Object.values(charts)) c.destroy();
  charts = {};
  const statuses = runsSeries();
  charts.runs = timeChart(document.getElementById("chart-runs"), {
    label: "Runs per bucket by status", buckets: data.buckets, series: statuses,
    onPick: (i, s) => go(runsLink({ status: s == null ? null : runsSeries()[s]?.status, ...bucketWindow(i) })),
  });
  charts.duration = timeChart(document.getElementById("chart-duration"), {
    label: "Run duration p50 and p95", buckets: data.buckets, fmt: ms,
    series: durationSeries(),
    onPick: (i) => go(runsLink({ ...bucketWindow(i), sort: "-duration" })),
  });
  charts.approvals = timeChart(document.getElementById("chart-approvals"), {
    label: "Approvals requested", buckets: data.buckets, height: 150,
    series: [{ label: "Requested", colour: "#c98a00", values: data.approvals.requested_series, bars: true }],
    onPick: (i) => go(runsLink({ ...bucketWindow(i) })),
  });
  drawBudgets();
}

const durationSeries = () => [
  { label: "p50", colour: "#2f6fdd", values: data.duration.p50_ms_series },
  { label: "p95", colour: "#c62828", values: data.duration.p95_ms_series },
];

function drawBudgets() {
  const box = document.getElementById("budgets");
  box.replaceChildren();
  const { periods, period_mode: mode } = data.budgets;
  let shown = 0;
  for (const [period, body] of Object.entries(periods)) {
    for (const [name, dim] of Object.entries(body.dimensions)) {
      // Every limit set, and the cost always (spend shows before any limit).
      if (dim.limit == null && name !== "cost") continue;
      charts[`burn-${period}-${name}`] = burnChart(box, { period, name, body, mode, onPick: () => go("/budget/") });
      shown += 1;
    }
  }
  if (!shown) box.append(el("p", { class: "muted", text: "No spend yet." }));
}

function updateCharts() {
  charts.runs.update({ buckets: data.buckets, series: runsSeries() });
  charts.duration.update({ buckets: data.buckets, series: durationSeries() });
  charts.approvals.update({ buckets: data.buckets, series: [{ label: "Requested", values: data.approvals.requested_series }] });
  for (const key of Object.keys(charts)) if (key.startsWith("burn-")) charts[key].destroy();
  drawBudgets();
}

function renderApprovals() {
  const a = data.approvals;
  patchChildren(document.getElementById("approvals-figures"),
    el("p", {}, el("a", { href: runsLink({ waiting: "approval" }), text: `${a.waiting} waiting` }),
      a.oldest_waiting_since ? ` (oldest since ${new Date(a.oldest_waiting_since).toLocaleString()})` : "",
      ` · ${a.decided} decided in the period, median ${ms(a.median_decision_ms)} to a decision`));
}

function topList(title, rows, text, href, testid) {
  return el("div", { "data-testid": testid }, el("h3", { class: "h3", text: title }),
    rows.length
      ? el("ol", {}, ...rows.map((row) => el("li", {}, el("a", { href: href(row), text: text(row) }))))
      : el("p", { class: "muted small", text: "None in this period." }));
}

function renderTops() {
  const p = periodOf();
  const { agents, tools } = data;
  patchChildren(document.getElementById("top-agents"),
    topList("By cost", agents.by_cost, (r) => `${r.agent}: ${money(r.cost)} (${r.runs} runs)`, (r) => runsLink({ agent: r.agent, ...p, sort: "-cost" }), "agents-by-cost"),
    topList("By failures", agents.by_failures, (r) => `${r.agent}: ${r.failed} failed of ${r.runs}`, (r) => runsLink({ status: "failed", agent: r.agent, ...p }), "agents-by-failures"));
  patchChildren(document.getElementById("top-tools"),
    topList("By cost (settled in the ledger)", tools.by_cost, (r) => `${r.tool}: ${money(r.cost)} (${r.calls} calls)`, (r) => runsLink({ tool: r.tool, ...p, sort: "-cost" }), "tools-by-cost"),
    topList("By failures", tools.by_failures, (r) => `${r.tool}: ${r.failed} failed of ${r.calls} calls`, (r) => runsLink({ tool: r.tool, has_error: "1", ...p }), "tools-by-failures"));
}

function render() {
  renderTiles();
  renderApprovals();
  renderTops();
  const next = chartsShape();
  if (next === shape && charts.runs) updateCharts(); else drawCharts();
  shape = next;
  document.getElementById("overview-updated").textContent = `Updated ${new Date().toLocaleTimeString()}`;
  // Milestones for bench/bench_ui_overview.py (ms since navigation; renders).
  const perf = (window.cpOverview ||= { renders: 0 });
  perf.renders += 1;
  perf.firstRender ??= performance.now();
}

let loading = null;
async function load() {
  if (loading) return loading;
  const now = Date.now();
  const query = new URLSearchParams({ from: iso(now - RANGES[range]), to: iso(now) });
  loading = (async () => {
    try {
      data = await api(`/api/v1/overview/?${query}`);
      document.getElementById("overview-error").hidden = true;
      render();
    } catch (error) {
      const box = document.getElementById("overview-error");
      box.hidden = false;
      box.textContent = `⚠ Not up to date: ${error.message}${data ? ` (showing the figures of ${new Date().toLocaleTimeString()})` : ""}`;
    } finally {
      loading = null;
    }
  })();
  return loading;
}

for (const button of document.querySelectorAll("[data-range]")) {
  button.setAttribute("aria-pressed", String(button.dataset.range === range));
  button.addEventListener("click", () => {
    range = button.dataset.range;
    for (const b of document.querySelectorAll("[data-range]")) b.setAttribute("aria-pressed", String(b === button));
    const url = new URL(location.href);
    url.searchParams.set("range", range);
    history.replaceState(null, "", url);
    load();
  });
}

const refresh = throttle(load, 5000);
await load();
setInterval(load, REFRESH_MS);
new Stream({
  path: "/ws/tenant/",
  cursorParam: "after_id",
  cursorOf: (event) => event.id,
  onEvent: refresh,
  onResync: refresh,
  poll: async () => { await load(); return []; },
}).start();
