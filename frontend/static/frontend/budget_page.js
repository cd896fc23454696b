// Budget: the tenant's period limits and usage as gauges, per-run caps, the
// per-end-user limits and the concurrency limit; admins edit them (the server validates, its messages show
// next to the fields).

import { api, ApiError } from "./api.js";
import { el, money } from "./format.js";
import { gauge } from "./gauge.js";
import { loadActivity } from "./budget_activity.js";

const root = document.getElementById("budget-root");
const canEdit = root.dataset.admin === "1"; // the role may write the budget
let budget = null;

const PERIOD_LABEL = { day: "Today", month: "This month" };
const DIM_LABEL = {
  input_tokens: "Input tokens", output_tokens: "Output tokens", cost: "Cost", runs: "Runs",
  max_steps: "Steps", max_tool_calls: "Tool calls", max_input_tokens: "Input tokens",
  max_output_tokens: "Output tokens", max_cost: "Cost", max_wall_seconds: "Wall time (s)",
};
const isCost = (name) => name === "cost" || name === "max_cost";
const fmtFor = (name) => (isCost(name) ? money : (v) => Number(v).toLocaleString());
const fieldId = (path) => `budget-${path.replace(/[^a-zA-Z0-9_]/g, "-")}`;

function problem(text) {
  const box = document.getElementById("budget-error");
  box.hidden = !text;
  box.textContent = text || "";
}

function render() {
  const limits = budget.limits || {};
  const usage = budget.usage || {};
  const reserved = budget.reserved || {};
  const sections = [];
  for (const period of Object.keys(PERIOD_LABEL)) {
    if (!limits[period]) continue;
    const rows = Object.entries(limits[period]).map(([name, cap]) => {
      const used = Number(usage[period]?.[name] ?? 0);
      const held = Number(reserved[period]?.[name] ?? 0);
      const g = gauge(DIM_LABEL[name] || name, used, cap == null ? null : Number(cap), fmtFor(name));
      if (held) g.querySelector(".g-text").textContent += ` · ${fmtFor(name)(held)} reserved`;
      return g;
    });
    sections.push(el("h3", { class: "h3", text: `${PERIOD_LABEL[period]} (${budget.period_mode || "calendar"})` }), el("div", { class: "gauges" }, ...rows));
  }
  if ("max_concurrent_runs" in limits) {
    sections.push(el("h3", { class: "h3", text: "Concurrency" }), el("div", { class: "gauges" },
      gauge("Active runs", Number(usage.max_concurrent_runs ?? 0), limits.max_concurrent_runs, String)));
  }
  if (limits.run) {
    sections.push(el("h3", { class: "h3", text: "Ceiling on each run's caps" }), el("dl", { class: "caps" },
      ...Object.entries(limits.run).flatMap(([name, cap]) => [el("dt", { text: DIM_LABEL[name] || name }), el("dd", { text: cap == null ? "no cap" : fmtFor(name)(cap) })])));
  }
  const perUser = Object.entries(limits.end_user || {}).flatMap(([period, caps]) =>
    Object.entries(caps || {}).filter(([, cap]) => cap != null).flatMap(([name, cap]) => [
      el("dt", { text: `${DIM_LABEL[name] || name} per ${period}` }), el("dd", { text: fmtFor(name)(cap) })]));
  sections.push(el("h3", { class: "h3", text: "Each end user at most" }), perUser.length
    ? el("dl", { class: "caps", "data-testid": "end-user-limits" }, ...perUser)
    : el("p", { class: "muted small", "data-testid": "end-user-limits", text: "No per-end-user limit: an end user may use what the tenant may." }));
  sections.push(el("p", { class: "muted small", text: `Unknown model prices: ${budget.allow_unknown_price ? "allowed (tokens counted, cost unbounded)" : "refused"}` }));
  document.getElementById("gauges").replaceChildren(...sections);
  if (canEdit) renderForm();
}

function input(path, value, label, { integer }) {
  const id = fieldId(path);
  return el("div", { class: "field" },
    el("label", { for: id, text: label }),
    el("input", { id, name: path, inputmode: integer ? "numeric" : "decimal", "data-integer": integer ? "1" : "0",
      value: value == null ? "" : String(value), placeholder: "no limit", "aria-describedby": `${id}-error` }),
    el("p", { class: "field-error", id: `${id}-error`, role: "alert" }));
}

function renderForm() {
  const limits = budget.limits || {};
  const groups = [];
  for (const group of ["day", "month", "run"]) {
    if (!limits[group]) continue;
    const title = group === "run" ? "Each run at most" : `Per ${group}`;
    groups.push(el("fieldset", {}, el("legend", { text: title }),
      ...Object.entries(limits[group]).map(([name, value]) =>
        input(`${group}.${name}`, value, DIM_LABEL[name] || name, { integer: !isCost(name) && name !== "max_wall_seconds" }))));
  }
  for (const period of ["day", "month"]) {
    const caps = limits.end_user?.[period];
    if (!caps) continue;
    groups.push(el("fieldset", {}, el("legend", { text: `Each end user, ${period === "day" ? "daily" : "monthly"}` }),
      ...Object.entries(caps).map(([name, value]) =>
        input(`end_user.${period}.${name}`, value, DIM_LABEL[name] || name, { integer: !isCost(name) }))));
  }
  const mode = el("select", { id: "budget-period_mode", name: "period_mode", "aria-describedby": "budget-period_mode-error" },
    ...["calendar", "rolling"].map((m) => el("option", { value: m, text: m, selected: budget.period_mode === m })));
  const unknown = el("input", { type: "checkbox", id: "budget-allow_unknown_price", name: "allow_unknown_price", checked: !!budget.allow_unknown_price });
  groups.push(el("fieldset", {}, el("legend", { text: "Tenant" }),
    input("max_concurrent_runs", limits.max_concurrent_runs, "Concurrent runs", { integer: true }),
    el("div", { class: "field" }, el("label", { for: "budget-period_mode", text: "Periods" }), mode,
      el("p", { class: "field-error", id: "budget-period_mode-error", role: "alert" })),
    el("div", { class: "field check" }, unknown, el("label", { for: "budget-allow_unknown_price", text: "Allow models without a known price" }))));
  document.getElementById("budget-fields").replaceChildren(...groups);
}

function clearErrors() {
  for (const n of document.querySelectorAll("#budget-form .field-error")) n.textContent = "";
  for (const n of document.querySelectorAll("#budget-form [aria-invalid]")) n.removeAttribute("aria-invalid");
  document.getElementById("budget-form-error").textContent = "";
  document.getElementById("budget-saved").textContent = "";
}

function showErrors(error) {
  let placed = false;
  for (const [path, messages] of Object.entries(error.fields || {})) {
    const clean = path.replace(/^limits\./, "");
    const id = fieldId(clean);
    const target = document.getElementById(`${id}-error`);
    const text = Array.isArray(messages) ? messages.join(" ") : String(messages);
    if (target) { target.textContent = text; document.getElementById(id)?.setAttribute("aria-invalid", "true"); document.getElementById(id)?.focus(); }
    else document.getElementById("budget-form-error").textContent += `${clean}: ${text} `;
    placed = true;
  }
  if (!placed) document.getElementById("budget-form-error").textContent = error.message;
}

document.getElementById("budget-form")?.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors();
  const limits = {};
  for (const field of document.querySelectorAll("#budget-fields input[data-integer]")) {
    const raw = field.value.trim();
    let value = null;
    if (raw !== "") value = field.dataset.integer === "1" && /^-?\d+$/.test(raw) ? Number(raw) : (Number.isNaN(Number(raw)) ? raw : Number(raw));
    if (isCost(field.name.split(".").at(-1)) && raw !== "") value = raw; // decimals travel as text
    // "max_concurrent_runs", "day.cost" or "end_user.day.cost": one object per dot.
    const path = field.name.split(".");
    let into = limits;
    for (const key of path.slice(0, -1)) into = into[key] = into[key] || {};
    into[path.at(-1)] = value;
  }
  const body = {
    period_mode: document.getElementById("budget-period_mode").value,
    allow_unknown_price: document.getElementById("budget-allow_unknown_price").checked,
    limits,
  };
  const save = document.getElementById("budget-save");
  save.disabled = true;
  try {
    budget = await api("/api/v1/budget/", { method: "PUT", body });
    render();
    loadActivity();
    document.getElementById("budget-saved").textContent = "Saved.";
  } catch (error) {
    if (error instanceof ApiError && error.status === 400) showErrors(error);
    else problem(`Could not save: ${error.message}`);
  } finally {
    save.disabled = false;
  }
});

loadActivity();
try {
  budget = await api("/api/v1/budget/");
  render();
} catch (error) {
  document.getElementById("gauges").replaceChildren(el("p", { class: "muted", text: error.status === 404 ? "Budgets are not configured on this server yet." : `Could not load the budget: ${error.message}` }));
}
