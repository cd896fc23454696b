// Budget: the tenant's limits and usage per period as gauges; admins edit the
// limits (the server validates; its messages appear next to the fields).

import { api, ApiError } from "./api.js";
import { el, money } from "./format.js";
import { gauge } from "./gauge.js";

const root = document.getElementById("budget-root");
const isAdmin = root.dataset.admin === "1";
let budget = null;

function problem(text) {
  const box = document.getElementById("budget-error");
  box.hidden = !text;
  box.textContent = text || "";
}

// Leaves of an object as dotted paths: {"day.cost": 5, ...}
function leaves(value, prefix = "", out = {}) {
  if (value && typeof value === "object" && !Array.isArray(value)) {
    for (const [k, v] of Object.entries(value)) leaves(v, prefix ? `${prefix}.${k}` : k, out);
  } else out[prefix] = value;
  return out;
}

function setPath(target, path, value) {
  const keys = path.split(".");
  let node = target;
  for (const k of keys.slice(0, -1)) node = node[k] = node[k] || {};
  node[keys.at(-1)] = value;
}

const fieldId = (path) => `budget-${path.replace(/[^a-zA-Z0-9_]/g, "-")}`;
const isCost = (path) => /cost|usd|money|spend/i.test(path);
const label = (path) => path.replace(/\./g, " · ").replace(/_/g, " ");

function limitsOf(data) { return data.limits ?? data.limit ?? null; }
function usageOf(data) { return data.usage ?? data.used ?? data.spent ?? null; }

function render() {
  const gauges = document.getElementById("gauges");
  const limits = limitsOf(budget);
  const usage = usageOf(budget);
  if (!limits) {
    gauges.replaceChildren(el("pre", { text: JSON.stringify(budget, null, 2) }));
    return;
  }
  const limitLeaves = leaves(limits);
  const usageLeaves = usage ? leaves(usage) : {};
  const rows = Object.entries(limitLeaves).filter(([, v]) => v === null || typeof v === "number" || (typeof v === "string" && v !== "" && !Number.isNaN(Number(v))));
  gauges.replaceChildren(...rows.map(([path, cap]) => {
    const used = Number(usageLeaves[path] ?? usageLeaves[path.replace(/^max_/, "")] ?? 0);
    return gauge(label(path), used, cap == null ? null : Number(cap), isCost(path) ? money : String);
  }));
  if (isAdmin) renderForm(limitLeaves);
}

function renderForm(limitLeaves) {
  const holder = document.getElementById("budget-fields");
  holder.replaceChildren(...Object.entries(limitLeaves).filter(([, v]) => typeof v !== "boolean" && typeof v !== "object" || v === null).map(([path, value]) => {
    const id = fieldId(path);
    return el("div", { class: "field" },
      el("label", { for: id, text: label(path) }),
      el("input", { id, name: path, inputmode: "decimal", value: value == null ? "" : String(value), placeholder: "no limit", "aria-describedby": `${id}-error` }),
      el("p", { class: "field-error", id: `${id}-error`, role: "alert" }));
  }));
}

function clearErrors() {
  for (const n of document.querySelectorAll("#budget-form .field-error")) n.textContent = "";
  for (const n of document.querySelectorAll("#budget-form [aria-invalid]")) n.removeAttribute("aria-invalid");
  document.getElementById("budget-form-error").textContent = "";
}

function showErrors(error) {
  const fields = leaves(error.fields || {});
  let placed = false;
  for (const [path, messages] of Object.entries(fields)) {
    const clean = path.replace(/^limits\./, "").replace(/\.\d+$/, "");
    const id = fieldId(clean);
    const target = document.getElementById(`${id}-error`);
    const text = Array.isArray(messages) ? messages.join(" ") : String(messages);
    if (target) { target.textContent += `${text} `; document.getElementById(id)?.setAttribute("aria-invalid", "true"); placed = true; }
    else { document.getElementById("budget-form-error").textContent += `${clean}: ${text} `; placed = true; }
  }
  if (!placed) document.getElementById("budget-form-error").textContent = error.message;
}

document.getElementById("budget-form")?.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors();
  const limits = {};
  let bad = false;
  for (const input of document.querySelectorAll("#budget-fields input")) {
    const raw = input.value.trim();
    let value = null;
    if (raw !== "") {
      value = Number(raw);
      if (Number.isNaN(value) || value < 0) {
        document.getElementById(`${input.id}-error`).textContent = "Enter a number ≥ 0, or leave empty for no limit.";
        input.setAttribute("aria-invalid", "true");
        bad = true;
        continue;
      }
      if (isCost(input.name)) value = raw; // decimals travel as strings
    }
    setPath(limits, input.name, value);
  }
  if (bad) return;
  const body = "limits" in budget ? { limits } : limits;
  try {
    budget = await api("/api/v1/budget/", { method: "PUT", body });
    document.getElementById("budget-saved").textContent = "Saved.";
    render();
  } catch (error) {
    if (error instanceof ApiError) showErrors(error); else problem(error.message);
  }
});

try {
  budget = await api("/api/v1/budget/");
  render();
} catch (error) {
  document.getElementById("gauges").replaceChildren(el("p", { class: "muted", text: error.status === 404 ? "Budgets are not configured on this server yet." : `Could not load the budget: ${error.message}` }));
  if (error.status && error.status !== 404) problem(error.message);
}
