// The run page's "Compare with…": pick a recent run of the same agent, or enter
// a run id (or paste a run's link), and open the diff of the two runs.

import { api, rowsOf } from "./api.js";
import { when } from "./format.js";

const root = document.getElementById("run-root");
const form = document.getElementById("compare-form");
const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/i;

async function fillRecent() {
  const select = document.getElementById("compare-recent");
  const query = new URLSearchParams({ agent: form.dataset.agent, limit: "20" });
  let runs = [];
  try {
    runs = rowsOf(await api(`/api/v1/runs/?${query}`)).filter((r) => r.id !== root.dataset.runId);
  } catch {
    runs = [];
  }
  select.replaceChildren(new Option(runs.length ? "choose a run…" : "no other runs", ""));
  for (const run of runs) {
    const input = (run.input || "").replace(/\s+/g, " ").slice(0, 60);
    select.append(new Option(`${run.id.slice(0, 8)} · ${run.status} · ${when(run.created_at)} · ${input}`, run.id));
  }
}

if (form) {
  const field = document.getElementById("compare-id");
  const error = document.getElementById("compare-error");
  document.getElementById("compare-recent").addEventListener("change", (event) => {
    if (event.target.value) field.value = event.target.value;
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const match = field.value.match(UUID);
    if (!match) {
      error.textContent = field.value.trim() ? "That is not a run id." : "Choose a run or enter its id.";
      field.setAttribute("aria-invalid", "true");
      field.focus();
      return;
    }
    if (match[0].toLowerCase() === root.dataset.runId) {
      error.textContent = "Choose another run than this one.";
      field.setAttribute("aria-invalid", "true");
      return;
    }
    window.location.assign(`/runs/${root.dataset.runId}/diff/${match[0].toLowerCase()}/`);
  });
  document.getElementById("run-compare").addEventListener("toggle", (event) => {
    if (event.target.open && !form.dataset.loaded) {
      form.dataset.loaded = "1";
      fillRecent();
    }
  }, { once: false });
}
