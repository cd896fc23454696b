// The run page's messages to the agent: the run's queued and delivered
// steering / follow-up messages, live (the run stream's `message.*` events,
// forwarded by run_page.js as `cp:run-message`), and, for those who may send,
// a box to send one (POST /api/v1/runs/<id>/messages/).

import { api } from "./api.js";
import { el, when } from "./format.js";
import { throttle } from "./stream.js";

const root = document.getElementById("run-messages");
const runId = document.getElementById("run-root").dataset.runId;
const list = document.getElementById("run-messages-list");
const form = document.getElementById("run-message-form");

function stateText(message) {
  if (message.state === "delivered") {
    const step = message.delivered_before_step;
    return step == null ? "delivered" : `delivered before step ${step + 1}`;
  }
  if (message.state === "dropped") return "not delivered (the run was cancelled)";
  return "queued (delivered at the next turn)";
}

function item(message) {
  return el("li", { class: "run-message", "data-testid": "run-message", "data-state": message.state },
    el("div", { class: "small muted" },
      el("strong", { text: message.author || "API" }), ` · ${when(message.created_at)} · `,
      el("span", { class: `status ${message.state === "delivered" ? "succeeded" : "queued"}`, "data-testid": "run-message-state", text: stateText(message) })),
    el("p", { class: "run-message-text", text: message.text }));
}

async function load() {
  let rows;
  try {
    rows = await api(`/api/v1/runs/${runId}/messages/`);
  } catch (error) {
    list.replaceChildren(el("li", { class: "error", text: `Could not load the messages: ${error.message}` }));
    return;
  }
  root.hidden = !rows.length && !form;
  list.replaceChildren(...(rows.length ? rows.map(item) : [el("li", { class: "muted small", text: "No messages yet." })]));
}
const loadSoon = throttle(load, 250);
document.addEventListener("cp:run-message", loadSoon);

if (form) {
  const text = document.getElementById("run-message-text");
  const error = document.getElementById("run-message-error");
  const send = document.getElementById("run-message-send");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    send.disabled = true;
    try {
      await api(`/api/v1/runs/${runId}/messages/`, { method: "POST", body: { text: text.value } });
      text.value = "";
      load();
    } catch (failure) {
      const named = failure.fields && failure.fields.text;
      error.textContent = named ? [].concat(named).join(" ") : failure.message;
    } finally {
      send.disabled = false;
    }
  });
}

load();
