// An eval run: read from the API and re-read every 2 s until every trial is
// graded (progress), then its figures and each case's trials, each linking to
// its run, with the graders' reasons. "Compare with…" opens two eval runs side
// by side, the earlier one as the baseline.

import { api } from "./api.js";
import { duration, el, money, statusBadge, tokens } from "./format.js";
import { pct, rateWithInterval } from "./eval_format.js";

const root = document.getElementById("eval-run-root");
const id = root.dataset.evalRun;
const POLL_MS = 2000;
const OPEN = new Set(["queued", "running"]);

function tile(label, value, detail, testid) {
  return el("div", { class: "tile", "data-testid": testid },
    el("span", { class: "label", text: label }),
    el("span", { class: "figure", text: value }),
    detail ? el("div", { class: "muted small", text: detail }) : null);
}

// An eval run's status as icon + word (format.js knows runs' statuses).
const RUN_STATES = {
  queued: ["◷", "queued", "queued"], running: ["⟳", "running", "running"],
  finished: ["✓", "finished", "succeeded"], failed: ["✕", "failed", "failed"],
  cancelled: ["⊘", "cancelled", "cancelled"],
};

function runBadge(status) {
  const [icon, word, look] = RUN_STATES[status] || ["•", status, "unset"];
  return el("span", { class: `status s-${look}` }, el("span", { class: "icon", "aria-hidden": "true", text: icon }), ` ${word}`);
}

function renderProgress(data) {
  const { done, total, passed } = data.progress;
  const share = total ? Math.round((done / total) * 100) : 0;
  const bar = document.getElementById("eval-progress-bar");
  bar.setAttribute("aria-valuenow", String(share));
  bar.setAttribute("aria-valuetext", `${done} of ${total} trials graded`);
  document.getElementById("eval-progress-fill").style.width = `${share}%`;
  const state = OPEN.has(data.status) ? "graded so far" : "graded";
  document.getElementById("eval-progress-text").textContent =
    `Trials ${done}/${total} ${state} (${share}%), ${passed} passed.`;
  document.getElementById("eval-run-status").replaceChildren(runBadge(data.status));
}

function renderFigures(data) {
  const s = data.summary || {};
  const box = document.getElementById("eval-figures");
  if (s.pass_at_1 == null) {
    box.replaceChildren(el("p", { class: "muted", text: "Figures appear when every trial has been graded." }));
  } else {
    const i = s.pass_at_1_interval || {};
    box.replaceChildren(
      tile("pass@1", pct(s.pass_at_1, 1), `${pct(i.confidence)} interval ${pct(i.low, 1)}–${pct(i.high, 1)}`, "fig-pass1"),
      tile(`pass@${s.k}`, pct(s.pass_at_k, 1), `at least one of ${s.k} trials passes`, "fig-passk"),
      tile(`pass^${s.k}`, pct(s.pass_hat_k, 1), `all ${s.k} trials pass`, "fig-passhatk"),
      tile("Mean cost", money(s.mean_cost), `per trial · ${money(s.total_cost)} in all`, "fig-cost"),
      tile("Mean tokens", tokens(Math.round(s.mean_tokens)), "per trial", "fig-tokens"),
      tile("Mean steps", Number(s.mean_steps).toFixed(1), "per trial", "fig-steps"),
      tile("Mean latency", duration(s.mean_latency_ms), "per trial", "fig-latency"),
      tile("Trials", String(s.trials), `${Number(s.effective_trials).toFixed(1)} effective (cases cluster)`, "fig-trials"),
    );
  }
  const notes = (s.notes || []).map((note) => el("li", { text: note }));
  document.getElementById("eval-notes").replaceChildren(
    notes.length ? el("ul", { class: "muted small", "aria-label": "Notes" }, ...notes) : "");
}

function trialItem(trial) {
  const verdict = trial.passed == null ? "open" : trial.passed ? "passed" : "failed";
  const status = trial.passed == null ? (trial.run_status || trial.status) : trial.passed ? "succeeded" : "failed";
  const label = `#${trial.index + 1} ${verdict}`;
  const link = trial.run
    ? el("a", { href: `/runs/${trial.run}/`, "data-testid": "trial-link" }, statusBadge(status, { short: true }), ` ${label}`)
    : el("span", {}, statusBadge(status, { short: true }), ` ${label} (run deleted)`);
  const reasons = (trial.grader_results || []).map((g) =>
    el("li", { class: g.passed ? "s-ok" : "s-failed" },
      el("span", { "aria-hidden": "true", text: g.passed ? "✓ " : g.error ? "⚠ " : "✕ " }),
      el("span", { class: "sr-only", text: g.passed ? "passed: " : g.error ? "could not judge: " : "failed: " }),
      el("code", { text: g.kind }), ` ${g.reason || ""}`));
  return el("li", { class: "trial", "data-testid": "trial", "data-verdict": verdict },
    link, reasons.length ? el("ul", { class: "reasons" }, ...reasons) : null);
}

function renderCases(data) {
  const figures = new Map(((data.summary || {}).cases || []).map((c) => [c.case, c]));
  const rows = data.cases.map((c) => {
    const ended = c.trials.filter((t) => t.passed != null);
    const passed = ended.filter((t) => t.passed).length;
    const f = figures.get(c.case);
    return el("tr", { "data-case": c.case },
      el("td", {}, el("code", { text: c.case })),
      el("td", { class: "num", "data-col": "passed", text: `${passed}/${c.trials.length}` }),
      el("td", { class: "num", text: f ? pct(f.pass_at_1) : "–" }),
      el("td", { class: "num", text: f ? pct(f.pass_hat_k) : "–" }),
      el("td", {}, el("ul", { class: "trials" }, ...c.trials.map(trialItem))));
  });
  document.getElementById("eval-cases").replaceChildren(...rows);
}

async function load() {
  const error = document.getElementById("eval-run-error");
  try {
    const data = await api(`/api/v1/evals/runs/${id}/`);
    error.hidden = true;
    renderProgress(data);
    renderFigures(data);
    renderCases(data);
    if (OPEN.has(data.status)) setTimeout(load, POLL_MS);
  } catch (failure) {
    error.hidden = false;
    error.textContent = `⚠ Not up to date: could not read the eval run (${failure.message}). Trying again.`;
    setTimeout(load, POLL_MS * 2);
  }
}

load();

const compare = document.getElementById("eval-compare-form");
compare?.addEventListener("submit", (event) => {
  event.preventDefault();
  const select = compare.elements.other;
  const option = select.selectedOptions[0];
  const message = document.getElementById("eval-compare-error");
  if (!select.value) {
    message.textContent = "Choose an eval run to compare with.";
    select.setAttribute("aria-invalid", "true");
    return;
  }
  const otherIsEarlier = Date.parse(option.dataset.created) <= Date.parse(root.dataset.created);
  const [before, after] = otherIsEarlier ? [select.value, id] : [id, select.value];
  window.location.assign(`/evals/runs/${before}/compare/${after}/`);
});
