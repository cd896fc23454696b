// API tokens: a member's own, or (admins) every member's. Create one (the
// secret is shown once, here, and never again) and revoke one: a revoked
// token fails on its next request, and the row says when and by whom.

import { api, ApiError, showFieldErrors } from "./api.js";
import { el, when } from "./format.js";

const root = document.getElementById("tokens-root");
const isAdmin = root.dataset.admin === "1";
const body = document.getElementById("tokens-body");

function problem(text) {
  const box = document.getElementById("tokens-error");
  box.hidden = !text;
  box.textContent = text || "";
}

function revokeButton(token) {
  // Two clicks: the first asks, the second revokes (no modal to dismiss).
  const label = token.name || token.prefix;
  const button = el("button", { type: "button", class: "danger", text: "Revoke", "aria-label": `Revoke ${label}` });
  button.addEventListener("click", async () => {
    if (button.dataset.armed !== "1") {
      button.dataset.armed = "1";
      button.textContent = "Confirm revoke";
      setTimeout(() => { button.dataset.armed = ""; button.textContent = "Revoke"; }, 5000);
      return;
    }
    button.disabled = true;
    try {
      await api(`/api/v1/tokens/${token.id}/revoke/`, { method: "POST" });
      problem("");
    } catch (error) {
      problem(`Could not revoke ${label}: ${error.message}`);
    }
    await load();
  });
  return button;
}

function status(token) {
  if (!token.revoked_at) return "active";
  return `revoked ${when(token.revoked_at)}${token.revoked_by ? ` by ${token.revoked_by}` : ""}`;
}

function render(tokens) {
  body.replaceChildren(...(tokens.length ? tokens.map((t) => el("tr", { "data-token": t.id, class: t.revoked_at ? "inactive" : null },
    el("th", { scope: "row", text: t.name || "(unnamed)" }),
    el("td", { text: t.owner }),
    el("td", {}, el("code", { text: `${t.prefix}…` })),
    el("td", {}, el("time", { datetime: t.created_at, text: when(t.created_at) })),
    el("td", { text: t.last_used_at ? when(t.last_used_at) : "never" }),
    el("td", { class: "token-status", text: status(t) }),
    el("td", { class: "actions" }, t.revoked_at ? null : revokeButton(t)),
  )) : [el("tr", {}, el("td", { colspan: 7, class: "muted", text: "No tokens yet." }))]));
}

async function load() {
  try {
    render(await api("/api/v1/tokens/"));
  } catch (error) {
    problem(`Could not load the tokens: ${error.message}`);
  }
}

async function loadMembers() {
  const select = document.getElementById("token-member");
  if (!isAdmin || !select) return;
  try {
    const members = await api("/api/v1/members/");
    const me = root.dataset.me;
    select.append(...members.filter((m) => m.active && m.username !== me)
      .map((m) => el("option", { value: String(m.id), text: `${m.username} (${m.role})` })));
  } catch (error) {
    problem(`Could not load the members: ${error.message}`);
  }
}

document.getElementById("secret-copy").addEventListener("click", async () => {
  const input = document.getElementById("secret-value");
  input.select();
  try { await navigator.clipboard.writeText(input.value); } catch { /* selected for a manual copy */ }
});

document.getElementById("token-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.target;
  const data = new FormData(form);
  const payload = { name: String(data.get("name") || "").trim() };
  const member = String(data.get("member") || "");
  if (member) payload.member = Number(member);
  document.getElementById("token-form-error").textContent = "";
  showFieldErrors("token", null);
  const submit = document.getElementById("token-submit");
  submit.disabled = true;
  try {
    const token = await api("/api/v1/tokens/", { method: "POST", body: payload });
    form.reset();
    document.getElementById("secret-box").hidden = false;
    document.getElementById("secret-text").textContent = `Token ${token.name || token.prefix} for ${token.owner}:`;
    document.getElementById("secret-value").value = token.token;
    problem("");
    await load();
  } catch (error) {
    if (error instanceof ApiError && error.status === 400) showFieldErrors("token", error, "token-form-error");
    else problem(`Could not create the token: ${error.message}`);
  } finally {
    submit.disabled = false;
  }
});

await loadMembers();
await load();
