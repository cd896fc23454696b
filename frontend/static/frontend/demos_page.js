// Demo scripts: "Run" starts one through the API and opens what it started
// (its run page, or the eval run's page for the eval script).

import { api, ApiError } from "./api.js";

const root = document.getElementById("demos-root");

function problem(text) {
  const box = document.getElementById("demos-error");
  box.hidden = !text;
  box.textContent = text || "";
}

async function start(button) {
  const slug = button.dataset.slug;
  button.disabled = true;
  problem("");
  try {
    const started = await api(`/api/v1/demo-scripts/${encodeURIComponent(slug)}/start/`, { method: "POST" });
    const page = started.kind === "eval_run" ? `/evals/runs/${started.id}/` : `/runs/${started.id}/`;
    window.location.assign(page);
  } catch (error) {
    const fields = error instanceof ApiError ? Object.values(error.fields).flat() : [];
    problem(`Could not start ${slug}: ${fields.join("; ") || error.message}`);
    button.disabled = false;
  }
}

if (root.dataset.canStart === "1") {
  for (const button of root.querySelectorAll("button.demo-run")) {
    button.addEventListener("click", () => start(button));
  }
}
