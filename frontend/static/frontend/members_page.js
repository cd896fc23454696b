// Members (admins): invite by email or create an account by username (a
// one-time password link is shown once), change a member's role, deactivate
// and reactivate. The server keeps the last active admin (409): the message
// says why and the row shows the role the server kept.

import { api, ApiError, showFieldErrors } from "./api.js";
import { el, when } from "./format.js";

const ROLES = ["admin", "operator", "viewer"];
const body = document.getElementById("members-body");

function problem(text) {
  const box = document.getElementById("members-error");
  box.hidden = !text;
  box.textContent = text || "";
}

function notice(text) {
  const box = document.getElementById("members-notice");
  box.hidden = !text;
  box.textContent = text || "";
}

function showLink(member, link) {
  notice("");
  const box = document.getElementById("link-box");
  box.hidden = false;
  const until = when(link.expires_at);
  document.getElementById("link-text").textContent = link.emailed
    ? `Emailed ${member.username} a link to set their password (valid until ${until}).`
    : `Send ${member.username} this link to set their password (valid until ${until}).`;
  document.getElementById("link-url").value = link.url;
}

document.getElementById("link-copy").addEventListener("click", async () => {
  const input = document.getElementById("link-url");
  input.select();
  try { await navigator.clipboard.writeText(input.value); } catch { /* selected for a manual copy */ }
});

function status(member) {
  if (!member.active) return `deactivated ${when(member.deactivated_at)}`;
  if (!member.password_set) {
    return member.password_link_expires_at
      ? `invited: link valid until ${when(member.password_link_expires_at)}`
      : "invited: no valid link";
  }
  return "active";
}

function roleSelect(member) {
  const select = el("select", { "aria-label": `Role of ${member.username}`, "data-role": member.role },
    ...ROLES.map((r) => el("option", { value: r, text: r, selected: r === member.role })));
  select.addEventListener("change", async () => {
    select.disabled = true;
    try {
      await api(`/api/v1/members/${member.id}/role/`, { method: "POST", body: { role: select.value } });
      problem("");
    } catch (error) {
      problem(`Could not change the role of ${member.username}: ${error.message}`);
    }
    await load();
  });
  return select;
}

function actionButton(member, label, path, { danger = false } = {}) {
  const button = el("button", { type: "button", class: danger ? "danger" : null, text: label, "aria-label": `${label} ${member.username}` });
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const answer = await api(`/api/v1/members/${member.id}/${path}/`, { method: "POST" });
      problem("");
      if (answer && answer.url) showLink(member, answer);
    } catch (error) {
      problem(`Could not ${label.toLowerCase()} ${member.username}: ${error.message}`);
    }
    await load();
  });
  return button;
}

function render(members) {
  body.replaceChildren(...(members.length ? members.map((m) => el("tr", { "data-member": m.username, class: m.active ? null : "inactive" },
    el("th", { scope: "row", text: m.username }),
    el("td", { text: m.email || "–" }),
    el("td", { class: "role" }, roleSelect(m)),
    el("td", { class: "member-status", text: status(m) }),
    el("td", {}, m.last_login ? el("time", { datetime: m.last_login, text: when(m.last_login) }) : "never"),
    el("td", { class: "actions" },
      m.active && !m.password_set ? actionButton(m, "New password link", "password-link") : null, " ",
      m.active ? actionButton(m, "Deactivate", "deactivate", { danger: true }) : actionButton(m, "Reactivate", "reactivate")),
  )) : [el("tr", {}, el("td", { colspan: 6, class: "muted", text: "No members." }))]));
}

async function load() {
  try {
    render(await api("/api/v1/members/"));
  } catch (error) {
    problem(`Could not load the members: ${error.message}`);
  }
}

function addForm(formId, prefix, path, fields) {
  const form = document.getElementById(formId);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const payload = Object.fromEntries(fields.map((f) => [f, String(data.get(f) || "").trim()]));
    document.getElementById(`${prefix}-form-error`).textContent = "";
    showFieldErrors(prefix, null);
    const submit = form.querySelector("button[type=submit]");
    submit.disabled = true;
    try {
      const added = await api(path, { method: "POST", body: payload });
      form.reset();
      problem("");
      if (added.password_link) showLink(added.member, added.password_link);
      else {
        document.getElementById("link-box").hidden = true;
        notice(`${added.member.username} joined as ${added.member.role}; they log in with the password they have.`);
      }
      await load();
    } catch (error) {
      if (error instanceof ApiError && error.status === 400) showFieldErrors(prefix, error, `${prefix}-form-error`);
      else problem(`Could not add the member: ${error.message}`);
    } finally {
      submit.disabled = false;
    }
  });
}

addForm("invite-form", "invite", "/api/v1/members/invite/", ["email", "role"]);
addForm("create-form", "create", "/api/v1/members/", ["username", "email", "role"]);
await load();
