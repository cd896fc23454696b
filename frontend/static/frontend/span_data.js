// What the span panel shows of a span's data: its payloads (a model call's
// input and output as a conversation, tool arguments and results as JSON),
// its sandbox egress, and the totals of the span and of everything under it.

import { conversation } from "./conversation.js";
import { duration, el, money, pretty, tokens } from "./format.js";

const PAYLOAD_TITLES = {
  "gen_ai.system_instructions": "System instructions", "gen_ai.input.messages": "Model input",
  "gen_ai.output.messages": "Model output", "gen_ai.tool.call.arguments": "Tool arguments",
  "gen_ai.tool.call.result": "Tool result", "gen_ai.tool.definitions": "Tool definitions",
};

const PAYLOAD_TEST_IDS = {
  "gen_ai.input.messages": "span-input", "gen_ai.output.messages": "span-output",
  "gen_ai.tool.call.arguments": "span-arguments", "gen_ai.tool.call.result": "span-result",
};

const MESSAGES = new Set(["gen_ai.input.messages", "gen_ai.output.messages"]);

function bodiesOf(full) {
  if (!full) return null;
  for (const key of ["payload_bodies", "payload_contents", "payload_values", "payloads"]) {
    const map = full[key];
    if (map && typeof map === "object" && !Array.isArray(map)) {
      const values = Object.values(map);
      if (!values.length || values.some((v) => typeof v !== "string" || !/^[0-9a-f]{64}$/.test(v))) return map;
    }
  }
  return null;
}

function order(name) {
  return Object.keys(PAYLOAD_TITLES).indexOf(name);
}

// One <details> per payload; `full` is the span as fetched (null: loading).
export function payloadSections(payloads, full) {
  const bodies = bodiesOf(full);
  const names = Object.keys(payloads || {});
  return names.sort((x, y) => order(x) - order(y)).map((name) => {
    const title = PAYLOAD_TITLES[name] || name;
    const body = bodies ? bodies[name] : undefined;
    const testid = PAYLOAD_TEST_IDS[name];
    let shown = null;
    if (body !== undefined && MESSAGES.has(name)) shown = conversation(body, { testid });
    if (shown) shown.setAttribute("aria-label", title);
    if (!shown) {
      const text = body === undefined ? (full?.error ? `Could not load: ${full.error}` : "Loading…") : pretty(body);
      shown = el("pre", { class: "payload", tabindex: "0", "aria-label": title, "data-testid": testid, text });
    }
    return el("details", { open: name !== "gen_ai.tool.definitions" && name !== "gen_ai.system_instructions" },
      el("summary", { text: title }), shown);
  });
}

// Each connection the sandbox's egress proxy allowed or refused (a `sandbox` span's
// `egress` events): the credential is named by its secret, never its value.
export function egressList(events) {
  return el("section", { class: "egress", "data-testid": "span-egress" }, el("h3", { text: `Egress (${events.length})` }),
    el("ol", { class: "egress-log" }, ...events.map((event) => {
      const x = event.attributes || {};
      const decision = x["cp.egress.decision"] || "";
      const facts = [];
      if (x["cp.egress.reason"]) facts.push(x["cp.egress.reason"]);
      if (x["cp.egress.bytes_out"] != null) facts.push(`${x["cp.egress.bytes_out"]} B out · ${x["cp.egress.bytes_in"] ?? 0} B in`);
      if (x["cp.egress.tls"]) facts.push("TLS by the proxy");
      if (x["cp.egress.credential"]) facts.push(`credential ${x["cp.egress.credential"]}`);
      return el("li", { class: `egress-${decision}` },
        el("strong", { text: decision }), " ", el("code", { text: x["cp.egress.target"] || "" }),
        x["cp.egress.address"] ? ` → ${x["cp.egress.address"]}` : "",
        facts.length ? el("div", { class: "muted small", text: facts.join(" · ") }) : null);
    })));
}

// Tokens, cost and time of the span itself and of its subtree (as the server
// counts it: GET /api/v1/spans/<pk>/subtree/; null while it loads).
export function totalsTable(s, ownCost, subtree) {
  const a = s.attributes || {};
  const inT = a["gen_ai.usage.input_tokens"];
  const outT = a["gen_ai.usage.output_tokens"];
  const latency = (s.ended_at ? Date.parse(s.ended_at) : Date.now()) - Date.parse(s.started_at);
  const own = {
    tokens: inT != null || outT != null ? `${tokens(inT ?? 0)} in / ${tokens(outT ?? 0)} out` : "–",
    cost: ownCost == null ? "–" : money(ownCost), latency: duration(latency),
  };
  const loading = subtree === null;
  const failed = subtree && subtree.error;
  const sub = (f) => (loading ? "…" : failed ? "?" : f(subtree));
  const rows = [
    ["Tokens", own.tokens, sub((t) => `${tokens(t.input_tokens)} in / ${tokens(t.output_tokens)} out`)],
    ["Cost", own.cost, sub((t) => money(t.cost))],
    ["Latency", own.latency, sub((t) => `${duration(t.model_ms)} in ${t.model_calls} model call${t.model_calls === 1 ? "" : "s"}`)],
    ["Tools", "", sub((t) => `${duration(t.tool_ms)} in ${t.tool_calls} call${t.tool_calls === 1 ? "" : "s"}`)],
    ["Waiting for a person", "", sub((t) => duration(t.waiting_ms))],
    ["Errors", ["error", "abandoned"].includes(s.status) ? "1" : "0", sub((t) => String(t.errors))],
  ];
  const head = loading || failed ? "With everything under it" : `With everything under it (${subtree.spans} span${subtree.spans === 1 ? "" : "s"})`;
  return el("section", { class: "totals", "data-testid": "span-totals" }, el("h3", { text: "Totals" }),
    el("table", { class: "attrs totals-table" },
      el("thead", {}, el("tr", {}, el("td"), el("th", { scope: "col", text: "This span" }), el("th", { scope: "col", text: head }))),
      el("tbody", {}, ...rows.map(([k, mine, theirs]) => el("tr", { "data-total": k },
        el("th", { scope: "row", text: k }), el("td", { text: mine }), el("td", { text: theirs }))))),
    failed ? el("p", { class: "muted small", text: `Could not count the subtree: ${subtree.error}` }) : null);
}
