// The budget page's activity: each period's burn-down with its forecast, the
// ledger's latest reservations (how each ended) and the budget extension
// requests with their outcomes (GET /api/v1/budget/activity/).

import { api } from "./api.js";
import { el, money, when } from "./format.js";
import { burnChart, DIM_LABEL, fmtDim, PERIOD_LABEL } from "./burn.js";

const shortId = (id) => id.slice(0, 8);
let charts = [];

function amounts(values) {
  if (!values) return "–";
  const parts = Object.entries(values).filter(([, v]) => Number(v)).map(([k, v]) => `${fmtDim(k)(v)} ${k === "cost" ? "" : (DIM_LABEL[k] || k).toLowerCase()}`.trim());
  return parts.length ? parts.join(", ") : "nothing";
}

function renderBurn(burn) {
  for (const c of charts) c.destroy();
  charts = [];
  const box = document.getElementById("burn-downs");
  box.replaceChildren();
  for (const [period, body] of Object.entries(burn.periods)) {
    const section = el("div", { "aria-label": PERIOD_LABEL[period] });
    box.append(section);
    for (const name of Object.keys(body.dimensions)) {
      charts.push(burnChart(section, { period, name, body, mode: burn.period_mode }));
    }
  }
}

function renderLedger(rows) {
  const box = document.getElementById("ledger");
  if (!rows.length) {
    box.replaceChildren(el("p", { class: "muted", text: "No reservations: the ledger is kept once a budget exists (set a limit below)." }));
    return;
  }
  box.replaceChildren(el("table", { class: "ledger-table small", "data-testid": "ledger-table" },
    el("thead", {}, el("tr", {}, ...["When", "Run", "Kind", "Reserved", "Outcome", "Spent"].map((t) => el("th", { scope: "col", text: t })))),
    el("tbody", {}, ...rows.map((r) => el("tr", {},
      el("td", { text: when(r.created_at) }),
      el("td", {}, el("a", { href: `/runs/${r.run_id}/`, text: shortId(r.run_id) })),
      el("td", { text: r.kind.replace("_", " ") + (r.from_grant ? " (from a grant)" : "") }),
      el("td", { text: amounts(r.reserved) }),
      el("td", { text: r.status === "reserved" ? "open" : `${r.status} ${r.settled_at ? when(r.settled_at) : ""}`.trim() }),
      el("td", { text: r.status === "settled" ? amounts(r.actual) : "–" }))))));
}

function renderExtensions(body) {
  const box = document.getElementById("extensions");
  const outcomes = Object.entries(body.outcomes).filter(([, n]) => n).map(([s, n]) => `${n} ${s}`).join(", ");
  const summary = el("p", { class: "small", "data-testid": "extension-outcomes", text: outcomes ? `Outcomes: ${outcomes}.` : "No extension requests yet (they are asked for when the budget's on_exhausted is \"ask\")." });
  if (!body.requests.length) { box.replaceChildren(summary); return; }
  box.replaceChildren(summary, el("table", { class: "ledger-table small", "data-testid": "extensions-table" },
    el("thead", {}, el("tr", {}, ...["Asked", "Run", "Extension", "Outcome", "Reason"].map((t) => el("th", { scope: "col", text: t })))),
    el("tbody", {}, ...body.requests.map((r) => {
      const x = r.extension || {};
      const amount = x.name === "cost" ? money(x.amount) : x.amount;
      const outcome = r.status === "pending" ? "waiting" : `${r.status}${r.decided_by ? ` by ${r.decided_by}` : ""}${r.decided_at ? ` ${when(r.decided_at)}` : ""}`;
      return el("tr", {},
        el("td", { text: when(r.requested_at) }),
        el("td", {}, el("a", { href: `/runs/${r.run_id}/`, text: `${r.agent} ${shortId(r.run_id)}` })),
        el("td", { text: `extend ${x.dimension || x.name || "?"} by ${amount ?? "?"}${x.limit ? ` (limit ${x.name === "cost" ? money(x.limit) : x.limit})` : ""}` }),
        el("td", { text: outcome }),
        el("td", { text: r.reason || "–" }));
    }))));
}

export async function loadActivity() {
  try {
    const body = await api("/api/v1/budget/activity/");
    renderBurn(body.burn_down);
    renderLedger(body.ledger);
    renderExtensions(body.extensions);
  } catch (error) {
    document.getElementById("burn-downs").replaceChildren(el("p", { class: "error", role: "alert", text: `Could not load the budget's activity: ${error.message}` }));
  }
}
