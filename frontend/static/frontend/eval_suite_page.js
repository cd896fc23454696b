// A suite's page: the cases and eval runs are rendered by the server; operators
// and admins add, edit and delete cases and start eval runs here through the
// API (the server checks each definition; its messages show at their field).

import { api, ApiError } from "./api.js";
import { formatRates } from "./eval_format.js";

formatRates();

const root = document.getElementById("suite-root");
const suite = root.dataset.suite;
const form = document.getElementById("case-form");
const JSON_FIELDS = { graders: "a JSON list", approvals: "a JSON list", world: "a JSON object" };

function clearErrors(prefix) {
  document.querySelectorAll(`[id^="${prefix}-"][id$="-error"]`).forEach((node) => { node.textContent = ""; });
  document.querySelectorAll(`[id^="${prefix}-"][aria-invalid]`).forEach((node) => node.removeAttribute("aria-invalid"));
}

function fieldError(prefix, field, text) {
  const target = document.getElementById(`${prefix}-${field}-error`);
  if (!target) return false;
  target.textContent = target.textContent ? `${target.textContent} ${text}` : text;
  document.getElementById(`${prefix}-${field}`)?.setAttribute("aria-invalid", "true");
  return true;
}

// A 400's fields by path (`graders[0].tool`): each message at the field its
// path starts with, the path kept so the person knows which entry.
function showServerErrors(prefix, error) {
  let placed = false;
  for (const [path, messages] of Object.entries(error.fields || {})) {
    const text = Array.isArray(messages) ? messages.join(" ") : typeof messages === "object" ? JSON.stringify(messages) : String(messages);
    const field = path.split(/[.[]/)[0];
    const shown = path === field ? text : `${path}: ${text}`;
    placed = fieldError(prefix, field, shown) || fieldError(prefix, "form", shown) || placed;
  }
  if (!placed) fieldError(prefix, "form", error.message);
}

function readCase() {
  const body = { slug: form.elements.slug.value.trim(), input: form.elements.input.value };
  const problems = [];
  if (!body.slug) problems.push(["slug", "Give the case a slug (letters, digits, - and _)."]);
  if (!body.input.trim()) problems.push(["input", "Write the input the agent gets."]);
  for (const [name, shape] of Object.entries(JSON_FIELDS)) {
    const text = form.elements[name].value.trim();
    if (!text) {
      if (name === "graders") problems.push([name, "A case needs at least one grader."]);
      continue;
    }
    try {
      body[name] = JSON.parse(text);
    } catch (error) {
      problems.push([name, `Not valid JSON (${error.message}); write ${shape}.`]);
    }
  }
  for (const [field, text] of problems) fieldError("case", field, text);
  return problems.length ? null : body;
}

function startEditing(row) {
  const editor = document.getElementById("case-editor");
  editor.open = true;
  form.dataset.editing = row.dataset.case;
  form.elements.slug.value = row.dataset.case;
  form.elements.input.value = row.dataset.input;
  form.elements.graders.value = row.dataset.graders;
  form.elements.approvals.value = row.dataset.approvals;
  form.elements.world.value = row.dataset.world;
  document.getElementById("case-editor-title").textContent = `Edit case ${row.dataset.case}`;
  document.getElementById("case-save").textContent = "Save case";
  document.getElementById("case-cancel").hidden = false;
  clearErrors("case");
  form.elements.input.focus();
}

function stopEditing() {
  form.reset();
  form.dataset.editing = "";
  document.getElementById("case-editor-title").textContent = "Add a case";
  document.getElementById("case-save").textContent = "Add case";
  document.getElementById("case-cancel").hidden = true;
  clearErrors("case");
}

if (form) {
  document.getElementById("case-cancel").addEventListener("click", stopEditing);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors("case");
    const body = readCase();
    if (!body) return;
    const editing = form.dataset.editing;
    const save = document.getElementById("case-save");
    save.disabled = true;
    try {
      if (editing) {
        await api(`/api/v1/evals/suites/${suite}/cases/${editing}/`, { method: "PUT", body: { world: {}, approvals: [], ...body } });
      } else {
        await api(`/api/v1/evals/suites/${suite}/cases/`, { method: "POST", body });
      }
      window.location.reload();
    } catch (error) {
      if (error instanceof ApiError && error.status === 400) showServerErrors("case", error);
      else fieldError("case", "form", `Not saved: ${error.message}`);
    } finally {
      save.disabled = false;
    }
  });
}

for (const button of document.querySelectorAll(".case-edit")) {
  button.addEventListener("click", () => startEditing(button.closest("tr")));
}

// Delete takes two clicks: the first asks, the second deletes.
for (const button of document.querySelectorAll(".case-delete")) {
  button.addEventListener("click", async () => {
    const slug = button.closest("tr").dataset.case;
    const error = document.getElementById("cases-error");
    error.hidden = true;
    if (!button.dataset.armed) {
      button.dataset.armed = "1";
      button.textContent = "Really delete?";
      button.setAttribute("aria-label", `Really delete case ${slug}?`);
      return;
    }
    button.disabled = true;
    try {
      await api(`/api/v1/evals/suites/${suite}/cases/${slug}/`, { method: "DELETE" });
      window.location.reload();
    } catch (failure) {
      error.textContent = `Case ${slug} was not deleted: ${failure.message}`;
      error.hidden = false;
      button.disabled = false;
      delete button.dataset.armed;
      button.textContent = "Delete";
      button.setAttribute("aria-label", `Delete case ${slug}`);
    }
  });
}

const start = document.getElementById("start-form");
if (start) {
  const agent = start.elements.agent;
  const version = start.elements.version;
  // Every agent's versions share values ("1", "2", ...): the list holds only
  // the chosen agent's, so a value names one option (hidden ones still match
  // a value, for assistive technology and for scripts alike).
  const allVersions = [...version.options];
  const showVersions = () => {
    const mine = allVersions.filter((option) => option.dataset.agent === agent.value);
    version.replaceChildren(...mine);
    const chosen = mine.find((option) => option.dataset.current) || mine[0];
    if (chosen) version.value = chosen.value;
  };
  agent.addEventListener("change", showVersions);
  showVersions();
  start.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors("start");
    const k = Number(start.elements.k.value);
    if (!Number.isInteger(k) || k < 1 || k > 100) {
      fieldError("start", "k", "k must be a whole number from 1 to 100.");
      return;
    }
    const submit = document.getElementById("start-submit");
    submit.disabled = true;
    try {
      const run = await api("/api/v1/evals/runs/", {
        method: "POST", body: { suite, agent: agent.value, version: Number(version.value), k },
      });
      window.location.assign(`/evals/runs/${run.id}/`);
    } catch (error) {
      if (error instanceof ApiError && error.status === 400) showServerErrors("start", error);
      else fieldError("start", "form", `Not started: ${error.message}`);
      submit.disabled = false;
    }
  });
}
