// Audit log (admins): server-side filters by action/object, text search over
// the loaded entries, newest first, paged.

import { api, rowsOf } from "./api.js";
import { el, when } from "./format.js";

const PAGE = 100;
let limit = PAGE;
let entries = [];
let total = 0;
const body = document.getElementById("audit-body");

async function load() {
  const form = new FormData(document.getElementById("audit-filters"));
  const params = new URLSearchParams({ limit: String(limit) });
  for (const key of ["action", "object_type", "object_id"]) {
    const value = String(form.get(key) || "").trim();
    if (value) params.set(key, value);
  }
  try {
    const page = await api(`/api/v1/audit/?${params}`);
    entries = rowsOf(page);
    total = page.count ?? entries.length;
    document.getElementById("audit-error").hidden = true;
    render();
  } catch (error) {
    const box = document.getElementById("audit-error");
    box.hidden = false;
    box.textContent = `Could not load the audit log: ${error.message}`;
  }
}

function change(entry) {
  const before = entry.before && Object.keys(entry.before).length ? JSON.stringify(entry.before) : "";
  const after = entry.after && Object.keys(entry.after).length ? JSON.stringify(entry.after) : "";
  return `${before ? `${before} → ` : ""}${after}`;
}

function render() {
  const text = document.getElementById("a-text").value.trim().toLowerCase();
  const shown = entries.filter((e) => !text || JSON.stringify(e).toLowerCase().includes(text));
  body.replaceChildren(...(shown.length ? shown.map((e) => el("tr", {},
    el("td", {}, el("time", { datetime: e.created_at, text: when(e.created_at) })),
    el("td", { text: e.actor || "system" }),
    el("td", {}, el("code", { text: e.action })),
    el("td", { text: `${e.object_type} ${e.object_id.slice(0, 12)}`, title: e.object_id }),
    el("td", { class: "change" }, el("code", { text: change(e).slice(0, 300), title: change(e) })),
    el("td", { text: e.remote_addr || "–" }))) : [el("tr", {}, el("td", { colspan: 6, class: "muted", text: "No audit entries match." }))]));
  document.getElementById("audit-more").hidden = entries.length >= total;
  document.getElementById("audit-count").textContent = `${shown.length} shown of ${total}`;
}

document.getElementById("audit-filters").addEventListener("submit", (e) => { e.preventDefault(); limit = PAGE; load(); });
document.getElementById("a-text").addEventListener("input", render);
document.getElementById("audit-more").addEventListener("click", () => { limit += PAGE; load(); });
await load();
