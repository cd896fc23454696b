// The run page's "Add to suite…": the run proposed as an eval case (its input,
// the orders it looked up, the decisions people took, graders proposed from
// what went wrong: GET /api/v1/runs/<id>/case-proposal/), the graders a person
// keeps, and the case added to a suite through the cases API.

import { api, rowsOf } from "./api.js";
import { el } from "./format.js";

const root = document.getElementById("run-root");
const form = document.getElementById("add-case-form");
let proposal = null;

const short = (value) => {
  const text = JSON.stringify(value);
  return text.length > 80 ? `${text.slice(0, 80)}…` : text;
};

// A grader as a sentence a person can tick.
export function describeGrader(g) {
  const args = g.args ? ` with ${short(g.args)}` : "";
  const status = g.status ? ` (${g.status})` : "";
  switch (g.kind) {
    case "must_call": return `must call ${g.tool}${args}${status}`;
    case "must_not_call": return `must not call ${g.tool}${args}${status}`;
    case "args": return `${g.tool} arguments at ${g.path || "$"} ${"equals" in g ? `equal ${short(g.equals)}` : "fit the schema"}`;
    case "final_answer_regex": return `final answer ${g.absent ? "does not match" : "matches"} /${g.pattern}/`;
    case "final_answer_json": return `final answer at ${g.path} ${"equals" in g ? `equals ${short(g.equals)}` : `contains ${short(g.contains)}`}`;
    case "world_state": return `exactly ${g.count} ${g.object} for order ${g.order_id}`;
    case "llm_judge": return `judge (${g.endpoint}): ${g.rubric}`;
    default: return short(g);
  }
}

function renderSetup(setup, p) {
  const orders = (p.case.world.orders || []).map((o) => o.order_id);
  const decisions = p.case.approvals.map((a) => `${a.tool}: ${a.decision}${a.reason ? ` (${a.reason})` : ""}`);
  setup.replaceChildren(
    el("p", { text: `World: ${orders.length ? `order${orders.length > 1 ? "s" : ""} ${orders.join(", ")} as the run saw ${orders.length > 1 ? "them" : "it"}` : "none"}.` }),
    el("p", { text: `Approvals decided as in this run: ${decisions.length ? decisions.join("; ") : "none"}.` }),
    ...p.notes.map((n) => el("p", { text: `Note: ${n}.` })),
  );
}

function renderGraders(box, p) {
  const items = p.graders.map((g, i) => el("label", { "data-testid": "proposed-grader" },
    el("input", { type: "checkbox", name: "grader", value: String(i), checked: g.checked }),
    " ", describeGrader(g.grader),
    el("span", { class: "why muted small", text: g.why })));
  box.replaceChildren(el("legend", { text: "Graders proposed from this run" }),
    ...(items.length ? items : [el("p", { class: "muted small", text: "Nothing to propose: add graders on the suite page." })]));
}

async function load() {
  const select = document.getElementById("add-case-suite");
  const box = document.getElementById("add-case-graders");
  try {
    const [suites, proposed] = await Promise.all([
      api("/api/v1/evals/suites/"),
      api(`/api/v1/runs/${root.dataset.runId}/case-proposal/`),
    ]);
    proposal = proposed;
    const rows = rowsOf(suites);
    select.replaceChildren(new Option(rows.length ? "choose a suite…" : "no suites yet: import one first", ""));
    for (const suite of rows) select.append(new Option(`${suite.name} (${suite.slug})`, suite.slug));
    document.getElementById("add-case-slug").value = proposal.case.slug;
    renderSetup(document.getElementById("add-case-setup"), proposal);
    renderGraders(box, proposal);
  } catch (error) {
    box.replaceChildren(el("p", { class: "error", text: `Could not propose a case: ${error.message}` }));
  }
}

function problemText(error) {
  const fields = Object.entries(error.fields || {}).map(([field, messages]) => `${field}: ${[].concat(messages).join(", ")}`);
  return fields.length ? fields.join("; ") : error.message;
}

if (form) {
  const error = document.getElementById("add-case-error");
  const done = document.getElementById("add-case-done");
  document.getElementById("add-to-suite").addEventListener("toggle", (event) => {
    if (event.target.open && !form.dataset.loaded) {
      form.dataset.loaded = "1";
      load();
    }
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    done.textContent = "";
    const suite = document.getElementById("add-case-suite").value;
    if (!proposal) return;
    if (!suite) { error.textContent = "Choose a suite."; return; }
    const chosen = [...form.querySelectorAll("input[name=grader]:checked")].map((box) => proposal.graders[Number(box.value)].grader);
    if (!chosen.length) { error.textContent = "Keep at least one grader: a case passes only by its graders."; return; }
    const button = document.getElementById("add-case-submit");
    button.disabled = true;
    try {
      const slug = document.getElementById("add-case-slug").value.trim();
      const made = await api(`/api/v1/evals/suites/${encodeURIComponent(suite)}/cases/`, {
        method: "POST",
        body: { ...proposal.case, slug, graders: chosen },
      });
      done.replaceChildren(`Added case ${made.slug} to ${suite} with ${chosen.length} grader${chosen.length === 1 ? "" : "s"}. `,
        el("a", { href: `/evals/suites/${encodeURIComponent(suite)}/`, text: "Open the suite" }));
    } catch (failure) {
      error.textContent = `Not added: ${problemText(failure)}`;
    } finally {
      button.disabled = false;
    }
  });
}
