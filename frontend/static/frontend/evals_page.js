// Evaluation suites: the list is rendered by the server; operators and admins
// import a suite file here (the server checks it; its message shows at the field).

import { api, ApiError } from "./api.js";
import { formatRates } from "./eval_format.js";

formatRates();

function problems(error) {
  const fields = error.fields || {};
  const lines = Object.entries(fields).map(([path, messages]) =>
    `${path}: ${Array.isArray(messages) ? messages.join(" ") : JSON.stringify(messages)}`);
  return lines.length ? lines.join("; ") : error.message;
}

document.getElementById("import-form")?.addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = document.getElementById("import-file");
  const message = document.getElementById("import-file-error");
  const result = document.getElementById("import-result");
  message.textContent = "";
  result.textContent = "";
  input.removeAttribute("aria-invalid");
  const file = input.files[0];
  if (!file) {
    message.textContent = "Choose a suite file to import.";
    input.setAttribute("aria-invalid", "true");
    return;
  }
  const button = document.getElementById("import-submit");
  button.disabled = true;
  try {
    const suite = await api("/api/v1/evals/suites/import/", { method: "POST", body: { yaml: await file.text() } });
    result.textContent = `${suite.created ? "Imported" : "Replaced"} suite ${suite.slug} (${suite.case_count} cases).`;
    window.location.assign(`/evals/suites/${suite.slug}/`);
  } catch (error) {
    message.textContent = error instanceof ApiError && error.status === 400
      ? `Not imported: ${problems(error)}`
      : `Could not import the file: ${error.message}`;
    input.setAttribute("aria-invalid", "true");
  } finally {
    button.disabled = false;
  }
});
