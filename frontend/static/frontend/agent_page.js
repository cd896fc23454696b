// One agent: admins save an edit (a new version), restore an old version,
// disable, enable or delete it; everyone compares two versions field by field.

import { api, ApiError } from "./api.js";
import { el } from "./format.js";
import { clearAgentErrors, readAgentForm, showAgentErrors } from "./agent_form.js";

const root = document.getElementById("agent-root");
const agentUrl = `/api/v1/agents/${root.dataset.agentId}/`;

function problem(text) {
  const box = document.getElementById("agent-error");
  box.hidden = !text;
  box.textContent = text || "";
}

async function act(path, method, { confirmText, then } = {}) {
  if (confirmText && !window.confirm(confirmText)) return;
  problem("");
  try {
    await api(agentUrl + path, { method });
    if (then) window.location.assign(then); else window.location.reload();
  } catch (error) {
    problem(`Could not do it: ${error.message}`);
  }
}

document.getElementById("agent-disable")?.addEventListener("click", () => act("disable/", "POST"));
document.getElementById("agent-enable")?.addEventListener("click", () => act("enable/", "POST"));
document.getElementById("agent-delete")?.addEventListener("click", () =>
  act("", "DELETE", { confirmText: "Delete this agent? Its runs keep their versions; no new run can start.", then: "/agents/" }));
for (const button of document.querySelectorAll("button.restore")) {
  button.addEventListener("click", () => act(`versions/${button.dataset.number}/restore/`, "POST"));
}

document.getElementById("agent-form")?.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearAgentErrors();
  const body = readAgentForm(event.target);
  if (!body) return;
  const save = document.getElementById("agent-save");
  save.disabled = true;
  try {
    await api(agentUrl, { method: "PUT", body });
    window.location.reload();
  } catch (error) {
    if (error instanceof ApiError && error.status === 400) showAgentErrors(error);
    else document.getElementById("agent-form-error").textContent = `Could not save: ${error.message}`;
  } finally {
    save.disabled = false;
  }
});

const show = (value) => (typeof value === "string" ? value : JSON.stringify(value, null, 1));

document.getElementById("compare-form")?.addEventListener("submit", async (event) => {
  event.preventDefault();
  const a = event.target.elements.a.value;
  const b = event.target.elements.b.value;
  const box = document.getElementById("compare-result");
  try {
    const diff = await api(`${agentUrl}versions/compare/?a=${a}&b=${b}`);
    if (!diff.changes.length) {
      box.replaceChildren(el("p", { class: "muted", text: `v${a} and v${b} are the same.` }));
      return;
    }
    box.replaceChildren(el("table", { class: "grid", id: "compare-table" },
      el("caption", { class: "sr-only", text: `What differs between v${a} and v${b}` }),
      el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "Field" }), el("th", { scope: "col", text: `v${a}` }), el("th", { scope: "col", text: `v${b}` }))),
      el("tbody", {}, ...diff.changes.map((c) => el("tr", { "data-field": c.field },
        el("th", { scope: "row", text: c.field }), el("td", {}, el("pre", { text: show(c.a) })), el("td", {}, el("pre", { text: show(c.b) })))))));
  } catch (error) {
    box.replaceChildren(el("p", { class: "error", text: `Could not compare: ${error.message}` }));
  }
});
