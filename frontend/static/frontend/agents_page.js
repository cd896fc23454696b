// Agents: the list is rendered by the server; admins create agents and model
// endpoints here (the server validates; its messages show next to the fields).

import { api, ApiError, showFieldErrors } from "./api.js";
import { clearAgentErrors, readAgentForm, showAgentErrors } from "./agent_form.js";

document.getElementById("agent-form")?.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearAgentErrors();
  const body = readAgentForm(event.target);
  if (!body) return;
  const save = document.getElementById("agent-save");
  save.disabled = true;
  try {
    const agent = await api("/api/v1/agents/", { method: "POST", body });
    window.location.assign(`/agents/${agent.id}/`);
  } catch (error) {
    if (error instanceof ApiError && error.status === 400) showAgentErrors(error);
    else document.getElementById("agent-form-error").textContent = `Could not create the agent: ${error.message}`;
  } finally {
    save.disabled = false;
  }
});

document.getElementById("endpoint-form")?.addEventListener("submit", async (event) => {
  event.preventDefault();
  document.getElementById("endpoint-form-error").textContent = "";
  showFieldErrors("endpoint", null);
  const form = event.target;
  const body = {};
  for (const name of ["slug", "name", "kind", "base_url", "api_key_secret"]) body[name] = form.elements[name].value.trim();
  try {
    await api("/api/v1/model-endpoints/", { method: "POST", body });
    window.location.reload();
  } catch (error) {
    if (error instanceof ApiError && error.status === 400) showFieldErrors("endpoint", error, "endpoint-form-error");
    else document.getElementById("endpoint-form-error").textContent = `Could not add the endpoint: ${error.message}`;
  }
});
