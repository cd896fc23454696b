// End users: the list of end users with memory, or one end user's memory files
// (dated entries) and budget use; admins delete an end user's memory (two
// clicks: the first asks, the second deletes).

import { api, ApiError } from "./api.js";
import { el, when } from "./format.js";

const root = document.getElementById("end-users-root");
const endUser = root.dataset.endUser;
const canDelete = root.dataset.admin === "1";

function problem(text) {
  const box = document.getElementById("end-users-error");
  box.hidden = !text;
  box.textContent = text || "";
}

async function loadList() {
  const body = document.getElementById("end-users-body");
  const rows = await api("/api/v1/end-users/");
  body.replaceChildren(...(rows.length ? rows.map((u) => el("tr", { "data-end-user": u.end_user },
    el("td", {}, el("a", { href: `/end-users/${encodeURIComponent(u.end_user)}/` }, el("code", { text: u.end_user }))),
    el("td", { class: "num", text: String(u.files) }),
    el("td", { class: "num", text: String(u.chars) }),
    el("td", {}, el("time", { datetime: u.updated_at, text: when(u.updated_at) })),
  )) : [el("tr", {}, el("td", { colspan: 4, class: "muted", text: "No end user has memory yet." }))]));
}

async function loadBudget() {
  const body = document.getElementById("end-user-budget-body");
  const data = await api(`/api/v1/end-users/${encodeURIComponent(endUser)}/budget/`);
  const rows = [];
  for (const period of ["day", "month"]) {
    for (const [name, limit] of Object.entries(data.limits[period] || {})) {
      const use = (data.usage[period] || {})[name] || { used: 0, reserved: 0 };
      rows.push(el("tr", {}, el("td", { text: period }), el("td", { text: name }),
        el("td", { class: "num", text: String(use.used) }), el("td", { class: "num", text: String(use.reserved) }),
        el("td", { class: "num", text: limit == null ? "no limit" : String(limit) })));
    }
  }
  body.replaceChildren(...rows);
}

async function loadMemory() {
  const box = document.getElementById("memory-files");
  const button = document.getElementById("delete-memory");
  let data;
  try {
    data = await api(`/api/v1/end-users/${encodeURIComponent(endUser)}/memory/`);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      box.replaceChildren(el("p", { class: "muted", text: "No memory is kept for this end user." }));
      if (button) button.hidden = true;
      return;
    }
    throw error;
  }
  if (button) button.hidden = !canDelete;
  box.replaceChildren(...data.files.map((f) => el("div", { class: "memory-file", "data-path": f.path },
    el("h3", { class: "h4" }, el("code", { text: f.path })),
    el("ul", {}, ...f.entries.map((e) => el("li", { "data-testid": "memory-entry", text: e.line }))))));
}

function armDelete() {
  const button = document.getElementById("delete-memory");
  if (!button) return;
  button.addEventListener("click", async () => {
    if (button.dataset.armed !== "1") {
      button.dataset.armed = "1";
      button.textContent = "Really delete all memory";
      setTimeout(() => { button.dataset.armed = ""; button.textContent = "Delete all memory"; }, 5000);
      return;
    }
    button.disabled = true;
    try {
      await api(`/api/v1/end-users/${encodeURIComponent(endUser)}/memory/`, { method: "DELETE" });
      problem("");
      await loadMemory();
    } catch (error) {
      problem(`Could not delete the memory: ${error.message}`);
    } finally {
      button.disabled = false;
      button.dataset.armed = "";
      button.textContent = "Delete all memory";
    }
  });
}

async function start() {
  try {
    if (endUser) {
      armDelete();
      await Promise.all([loadMemory(), loadBudget()]);
    } else {
      await loadList();
    }
  } catch (error) {
    problem(`Could not load: ${error.message}`);
  }
}

start();
