// The agent form (create and edit): read it into an API body, show the server's
// field errors under their fields.

import { showFieldErrors } from "./api.js";

const LINES = ["tools", "evaluated_models"];
const JSON_FIELDS = { skills: [], tool_settings: {}, default_limits: {}, script: [], guardrails: [], hooks: [], subagents: [] };
const TEXT = ["slug", "name", "endpoint", "model", "fallback_model", "system_prompt", "evaluator"];

// The body the API takes, or null when a JSON field does not parse (its error
// is shown under it; nothing is sent).
export function readAgentForm(form) {
  const value = (name) => form.querySelector(`[name="${name}"]`)?.value;
  const body = {};
  for (const name of TEXT) if (value(name) !== undefined) body[name] = name === "system_prompt" ? value(name) : value(name).trim();
  body.fallback_endpoint = value("fallback_endpoint") || null;
  for (const name of LINES) body[name] = value(name).split("\n").map((s) => s.trim()).filter(Boolean);
  const problems = {};
  for (const [name, empty] of Object.entries(JSON_FIELDS)) {
    const raw = value(name).trim();
    try { body[name] = raw ? JSON.parse(raw) : empty; } catch (error) { problems[name] = [`not valid JSON: ${error.message}`]; }
  }
  if (Object.keys(problems).length) {
    showAgentErrors({ fields: problems, message: "" });
    return null;
  }
  return body;
}

export function showAgentErrors(error) {
  document.getElementById("agent-form-error").textContent = "";
  showFieldErrors("agent", error, "agent-form-error");
  const first = document.querySelector('#agent-form [aria-invalid="true"]');
  if (first) {
    first.closest("details")?.setAttribute("open", "");
    first.focus();
  }
}

export function clearAgentErrors() {
  document.getElementById("agent-form-error").textContent = "";
  showFieldErrors("agent", null);
}
