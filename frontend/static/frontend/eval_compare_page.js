// Two eval runs of a suite compared (GET /api/v1/evals/runs/<a>/compare/<b>/):
// the cases that flipped, each opening the run diff of a passing and a failing
// trial; each figure's change with its interval; the small-sample warning.

import { api } from "./api.js";
import { duration, el, money } from "./format.js";
import { pct, signed, signedPoints } from "./eval_format.js";

const root = document.getElementById("eval-compare-root");
const { before, after } = root.dataset;

const RATES = [["pass_at_1", "pass@1"], ["pass_at_k", "pass@k"], ["pass_hat_k", "pass^k"]];
const MEANS = [
  ["cost", "Mean cost per trial", (v) => money(v)],
  ["latency_ms", "Mean latency per trial", (v) => duration(v)],
  ["tokens", "Mean tokens per trial", (v) => Number(v).toFixed(0)],
  ["steps", "Mean steps per trial", (v) => Number(v).toFixed(1)],
];

function side(run) {
  return `${run.agent}${run.external ? " (external)" : ` v${run.version}`} (k=${run.k}, ${run.passed}/${run.trials} trials passed)`;
}

function flipItem(flip) {
  const regressed = flip.direction === "regressed";
  const words = regressed ? "regressed: passed → failed" : "fixed: failed → passed";
  const link = flip.diff
    ? el("a", { href: `/runs/${flip.diff.before_run}/diff/${flip.diff.after_run}/`, "data-testid": "flip-diff" },
      `Diff the two trials (${flip.diff.before_run.slice(0, 8)} → ${flip.diff.after_run.slice(0, 8)})`)
    : el("span", { class: "muted", text: "a trial's run was deleted: nothing to diff" });
  return el("li", { "data-testid": "flip", "data-case": flip.case, "data-direction": flip.direction },
    el("span", { class: `status ${regressed ? "s-failed" : "s-succeeded"}` },
      el("span", { class: "icon", "aria-hidden": "true", text: regressed ? "↓" : "↑" }), ` ${words}`),
    " ", el("code", { text: flip.case }),
    ` pass@1 ${pct(flip.before_pass_at_1)} → ${pct(flip.after_pass_at_1)} · `, link);
}

function metricRow(label, m, show, change, key) {
  const i = m.interval;
  const interval = i ? `${pct(i.confidence)}: ${change(i.low)} to ${change(i.high)}` : "one case: no interval";
  return el("tr", { "data-metric": key },
    el("th", { scope: "row", text: label }),
    el("td", { class: "num", text: show(m.before) }),
    el("td", { class: "num", text: show(m.after) }),
    el("td", { class: "num", text: change(m.delta) }),
    el("td", { text: interval }));
}

function caseRow(c) {
  const flip = c.flip === "regressed" ? "↓ regressed" : c.flip === "fixed" ? "↑ fixed" : "–";
  return el("tr", { "data-case": c.case },
    el("td", {}, el("code", { text: c.case })),
    el("td", { class: "num", text: `${c.before.passed}/${c.before.trials}` }),
    el("td", { class: "num", text: `${c.after.passed}/${c.after.trials}` }),
    el("td", { class: c.flip === "regressed" ? "s-failed" : c.flip === "fixed" ? "s-succeeded" : "", text: flip }));
}

function render(data) {
  document.getElementById("compare-error").hidden = true;
  document.getElementById("compare-heading").replaceChildren(
    "Suite ", el("a", { href: `/evals/suites/${data.suite}/` }, el("code", { text: data.suite })), ": before ",
    el("a", { href: `/evals/runs/${data.before.id}/`, "data-testid": "before-link" }, side(data.before)), ", after ",
    el("a", { href: `/evals/runs/${data.after.id}/`, "data-testid": "after-link" }, side(data.after)),
    `. ${data.cases_compared} cases compared at k=${data.k}.`);
  const warning = document.getElementById("compare-warning");
  warning.hidden = !data.warning;
  warning.textContent = data.warning ? `⚠ ${data.warning}.` : "";
  const flips = data.flips.map(flipItem);
  document.getElementById("compare-flips").replaceChildren(
    ...(flips.length ? flips : [el("li", { class: "muted", text: "No case flipped." })]));
  const rows = [
    ...RATES.map(([key, label]) => metricRow(label.replace("k", String(data.k)), data.metrics[key], (v) => pct(v, 1), signedPoints, key)),
    ...MEANS.map(([key, label, show]) => metricRow(label, data.metrics[key], show, (v) => signed(v, show), key)),
  ];
  document.getElementById("compare-metrics").replaceChildren(...rows);
  document.getElementById("compare-method").textContent =
    `Changes are after − before, the mean of per-case differences; intervals are paired, at ${pct(data.confidence)}. ` +
    `A case flips when its pass@1 moves by ${pct(data.flip_threshold)} or more. ` +
    `This sample detects a true pass@1 change of ${signedPoints(data.minimum_detectable_difference).replace("+", "")} (${pct(data.power)} power).`;
  document.getElementById("compare-cases").replaceChildren(...data.cases.map(caseRow));
  const unpaired = [];
  if (data.cases_added.length) unpaired.push(`Only in the after run: ${data.cases_added.join(", ")}.`);
  if (data.cases_removed.length) unpaired.push(`Only in the before run: ${data.cases_removed.join(", ")}.`);
  document.getElementById("compare-unpaired").textContent = unpaired.join(" ");
}

async function load() {
  try {
    render(await api(`/api/v1/evals/runs/${before}/compare/${after}/`));
  } catch (failure) {
    const error = document.getElementById("compare-error");
    error.hidden = false;
    const fields = Object.values(failure.fields || {}).flat().join(" ");
    error.textContent = `These eval runs cannot be compared: ${fields || failure.message}`;
    document.getElementById("compare-heading").textContent = "";
    document.getElementById("compare-flips").replaceChildren();
    // A run still going may finish soon; a failed or cancelled one never will.
    const going = ["queued", "running"].includes(failure.body?.error?.status);
    if (failure.status === 409 && going) setTimeout(load, 3000);
  }
}

load();
