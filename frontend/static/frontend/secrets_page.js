// Secrets: the tenant's secret names, who set each and when; admins set (create
// or replace) and delete them. A value goes to the server once and is never
// read back: the API has no way to return it, and the input is cleared after
// saving.

import { api, ApiError, showFieldErrors } from "./api.js";
import { el, when } from "./format.js";

const root = document.getElementById("secrets-root");
const canWrite = root.dataset.admin === "1"; // the role may set and delete
const body = document.getElementById("secrets-body");

function problem(text) {
  const box = document.getElementById("secrets-error");
  box.hidden = !text;
  box.textContent = text || "";
}

function deleteButton(name) {
  // Two clicks: the first asks, the second deletes (no modal to dismiss).
  const button = el("button", { type: "button", class: "danger", text: "Delete", "aria-label": `Delete ${name}` });
  button.addEventListener("click", async () => {
    if (button.dataset.armed !== "1") {
      button.dataset.armed = "1";
      button.textContent = "Confirm delete";
      setTimeout(() => { button.dataset.armed = ""; button.textContent = "Delete"; }, 5000);
      return;
    }
    button.disabled = true;
    try {
      await api(`/api/v1/secrets/${encodeURIComponent(name)}/`, { method: "DELETE" });
      problem("");
      await load();
    } catch (error) {
      button.disabled = false;
      problem(`Could not delete ${name}: ${error.message}`);
    }
  });
  return button;
}

function replaceButton(name) {
  return el("button", { type: "button", text: "Replace", "aria-label": `Replace the value of ${name}`, onclick: () => {
    document.getElementById("secret-name").value = name;
    document.getElementById("secret-value").focus();
  } });
}

function render(secrets) {
  const columns = canWrite ? 5 : 4;
  body.replaceChildren(...(secrets.length ? secrets.map((s) => el("tr", { "data-name": s.name },
    el("td", {}, el("code", { text: s.name })),
    el("td", { text: s.updated_by || "system" }),
    el("td", {}, el("time", { datetime: s.updated_at, text: when(s.updated_at) })),
    el("td", {}, el("time", { datetime: s.created_at, text: `${when(s.created_at)}${s.created_by ? ` by ${s.created_by}` : ""}` })),
    canWrite ? el("td", { class: "actions" }, replaceButton(s.name), " ", deleteButton(s.name)) : null,
  )) : [el("tr", {}, el("td", { colspan: columns, class: "muted", text: "No secrets yet." }))]));
}

async function load() {
  try {
    render(await api("/api/v1/secrets/"));
  } catch (error) {
    problem(`Could not load the secrets: ${error.message}`);
  }
}

document.getElementById("secret-form")?.addEventListener("submit", async (event) => {
  event.preventDefault();
  const nameInput = document.getElementById("secret-name");
  const valueInput = document.getElementById("secret-value");
  const name = nameInput.value.trim();
  const saved = document.getElementById("secret-saved");
  saved.textContent = "";
  document.getElementById("secret-form-error").textContent = "";
  showFieldErrors("secret", null);
  const save = document.getElementById("secret-save");
  save.disabled = true;
  try {
    const secret = await api("/api/v1/secrets/", { method: "POST", body: { name, value: valueInput.value } });
    valueInput.value = "";
    nameInput.value = "";
    saved.textContent = `Saved ${secret.name}.`;
    problem("");
    await load();
  } catch (error) {
    if (error instanceof ApiError && error.status === 400) showFieldErrors("secret", error, "secret-form-error");
    else problem(`Could not save: ${error.message}`);
  } finally {
    save.disabled = false;
  }
});

await load();
