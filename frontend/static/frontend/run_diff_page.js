// Two runs side by side, steps aligned by meaning (GET /api/v1/runs/<a>/diff/<b>/),
// or a run beside its replay (GET /api/v1/runs/<a>/replay-diff/): totals at the
// top, one row per aligned pair, changed arguments highlighted, the first
// divergence marked and scrolled into view.

import { api } from "./api.js";
import { duration, el, money, statusBadge, tokens } from "./format.js";

const root = document.getElementById("diff-root");
const left = root.dataset.left;
const right = root.dataset.right;
const started = performance.now();
window.cpRunDiff = { firstRender: null };

const KIND_LABEL = { same: "same", changed: "changed", inserted: "inserted →", skipped: "← skipped" };

function json(value) {
  return typeof value === "string" ? JSON.stringify(value) : JSON.stringify(value);
}

function signed(n, format) {
  if (n == null) return "–";
  const v = Number(n);
  if (v === 0) return "0";
  return `${v > 0 ? "+" : "−"}${format(Math.abs(v))}`;
}

function totalsRows(body) {
  const l = body.left.totals, r = body.right.totals, d = body.totals_delta;
  const rows = [
    ["Status", statusBadge(body.left.status), statusBadge(body.right.status), ""],
    ["Agent", `${body.left.agent}${body.left.agent_version ? ` v${body.left.agent_version}` : ""}`,
      `${body.right.agent}${body.right.agent_version ? ` v${body.right.agent_version}` : ""}`, ""],
    ["Steps", String(l.steps), String(r.steps), signed(d.steps, String)],
    ["Tool calls", String(l.tool_calls), String(r.tool_calls), signed(d.tool_calls, String)],
    ["Tokens in / out", `${tokens(l.input_tokens)} / ${tokens(l.output_tokens)}`,
      `${tokens(r.input_tokens)} / ${tokens(r.output_tokens)}`,
      `${signed(d.input_tokens, tokens)} / ${signed(d.output_tokens, tokens)}`],
    ["Cost", money(l.cost), money(r.cost), signed(d.cost, money)],
    ["Duration", l.duration_s == null ? "–" : duration(l.duration_s * 1000),
      r.duration_s == null ? "–" : duration(r.duration_s * 1000),
      signed(d.duration_s == null ? null : d.duration_s * 1000, duration)],
  ];
  return rows.map(([name, a, b, delta]) => el("tr", { "data-total": name },
    el("th", { scope: "row", text: name }),
    typeof a === "string" ? el("td", { text: a }) : el("td", {}, a),
    typeof b === "string" ? el("td", { text: b }) : el("td", {}, b),
    el("td", { class: "num", text: delta })));
}

// The call's arguments, one line per top-level key; the keys a change touches
// are marked.
function argumentsBlock(args, changes, side) {
  const touched = new Set((changes || []).map((c) => c.path.split(/[.[]/)[0]));
  const box = el("div", { class: "diff-args", "data-testid": `args-${side}` });
  if (args && typeof args === "object" && !Array.isArray(args)) {
    const keys = Object.keys(args);
    if (!keys.length) box.append(el("span", { class: "muted", text: "{}" }));
    for (const key of keys) {
      const line = el("div", { class: touched.has(key) ? "arg arg-changed" : "arg" },
        el("span", { class: "arg-key", text: `${key}: ` }),
        el("code", { text: json(args[key]) }));
      box.append(touched.has(key) ? el("mark", {}, line) : line);
    }
  } else {
    box.append(el("code", { text: json(args) }));
  }
  return box;
}

function changesBlock(changes) {
  if (!changes || !changes.length) return null;
  const list = el("ul", { class: "arg-diff", "data-testid": "arg-diff", "aria-label": "Arguments changed" });
  for (const c of changes) {
    const item = el("li", {}, el("code", { class: "arg-path", text: c.path }), " ");
    if (c.op !== "added") item.append(el("del", { text: json(c.left) }));
    if (c.op === "changed") item.append(" → ");
    if (c.op !== "removed") item.append(el("ins", { text: json(c.right) }));
    list.append(item);
  }
  return list;
}

function stepBlock(step, pair, side) {
  if (!step) return el("div", { class: `diff-side side-${side} absent`, text: "(not in this run)" });
  const box = el("div", { class: `diff-side side-${side}` });
  const head = el("div", { class: "diff-step-head" },
    el("span", { class: "step-index", text: `Step ${step.index}` }), " ",
    el("span", { class: "muted small", text: [step.model, `${tokens(step.input_tokens)} in / ${tokens(step.output_tokens)} out`, money(step.cost), step.latency_ms == null ? null : duration(step.latency_ms)].filter(Boolean).join(" · ") }));
  box.append(head);
  if (step.input_delta.length) {
    const delta = el("details", { class: `input-delta${pair.input_differs ? " differs" : ""}` },
      el("summary", { class: "small", text: `Model input: ${step.input_delta.length} new message${step.input_delta.length === 1 ? "" : "s"}${pair.input_differs ? " (differs)" : ""}` }));
    for (const line of step.input_delta) delta.append(el("div", { class: "small mono", text: line }));
    box.append(delta);
  }
  if (step.action === "final_answer") {
    box.append(el("div", { class: "action" }, el("strong", { text: "Final answer" })),
      el("p", { class: "answer", "data-testid": `answer-${side}`, text: step.text }));
  } else if (step.action === "tool_calls") {
    step.calls.forEach((call, position) => {
      const changes = (pair.argument_changes || [])[position];
      box.append(el("div", { class: "action" },
        el("strong", { class: "tool", "data-testid": `tool-${side}`, text: call.tool }), " ",
        el("span", { class: `status s-${call.status}`, text: call.status })));
      box.append(argumentsBlock(call.arguments, changes, side));
      if (call.observation) box.append(el("div", { class: "observation small mono", title: "What the model read back", text: call.observation }));
    });
    if (step.text) box.append(el("p", { class: "muted small", text: step.text }));
  } else {
    box.append(el("div", { class: "action" }, el("strong", { text: step.action.replace("_", " ") })),
      el("p", { class: "muted small", text: step.text }));
  }
  return box;
}

function pairRow(pair, index, firstIndex) {
  const first = index === firstIndex;
  const row = el("section", {
    class: `diff-pair k-${pair.kind}${first ? " first-divergence" : ""}`,
    role: "listitem", "data-testid": "diff-pair", "data-kind": pair.kind, "data-pair": String(index),
    "aria-label": `${pair.kind}${pair.reasons.length ? `: ${pair.reasons.join("; ")}` : ""}`,
  });
  const middle = el("div", { class: "diff-kind" }, el("span", { class: `kind-badge k-${pair.kind}`, text: KIND_LABEL[pair.kind] }));
  if (first) middle.prepend(el("span", { class: "divergence-marker", "data-testid": "first-divergence", text: "First divergence" }));
  row.append(stepBlock(pair.left, pair, "left"), middle, stepBlock(pair.right, pair, "right"));
  const changes = (pair.argument_changes || []).flat();
  if (pair.reasons.length || changes.length) {
    const why = el("div", { class: "diff-why small" }, el("span", { text: pair.reasons.join("; ") }));
    const list = changesBlock(changes);
    if (list) why.append(list);
    row.append(why);
  }
  return row;
}

async function load() {
  let body;
  try {
    body = await api(root.dataset.replay
      ? `/api/v1/runs/${encodeURIComponent(left)}/replay-diff/`
      : `/api/v1/runs/${encodeURIComponent(left)}/diff/${encodeURIComponent(right)}/`);
  } catch (error) {
    const box = document.getElementById("diff-error");
    box.textContent = `Could not compare the runs: ${error.message}`;
    box.hidden = false;
    return;
  }
  const tbody = document.querySelector("#diff-totals tbody");
  tbody.replaceChildren(...totalsRows(body));
  const first = body.first_divergence;
  const summary = document.getElementById("diff-summary");
  const c = body.counts;
  summary.replaceChildren(
    el("span", { text: `${c.same} same, ${c.changed} changed, ${c.inserted} inserted, ${c.skipped} skipped. ` }),
    first
      ? el("a", { href: `#pair-${first.pair}`, "data-testid": "first-divergence-link",
        text: `First divergence at left step ${first.left_index ?? "–"} / right step ${first.right_index ?? "–"}: ${first.reason}` })
      : el("strong", { text: root.dataset.replay ? "The replay did what the run did." : "The runs did the same things." }));
  const list = document.createDocumentFragment();
  const firstIndex = first ? first.pair : -1;
  body.pairs.forEach((pair, index) => {
    const row = pairRow(pair, index, firstIndex);
    row.id = `pair-${index}`;
    list.append(row);
  });
  const container = document.getElementById("diff-pairs");
  container.replaceChildren(list);
  if (first) document.getElementById(`pair-${first.pair}`).scrollIntoView({ block: "center" });
  requestAnimationFrame(() => { window.cpRunDiff.firstRender = performance.now() - started; });
}

load();
