// MCP servers: each server with its tools and their pin status. A `changed` tool
// is disabled: the page shows the definition the server lists now beside the
// accepted one, and admins accept it (naming the hash they reviewed) or leave it
// disabled. Annotations are the server's hints, shown as such.

import { api, ApiError } from "./api.js";
import { el, when } from "./format.js";

const root = document.getElementById("mcp-root");
const canWrite = root.dataset.admin === "1";
const list = document.getElementById("mcp-servers");

function problem(text) {
  const box = document.getElementById("mcp-error");
  box.hidden = !text;
  box.textContent = text || "";
}

function say(text) {
  document.getElementById("mcp-status").textContent = text || "";
}

const STATUS_WORDS = {
  active: "active",
  changed: "changed: disabled until accepted",
  removed: "removed by the server",
  invalid: "invalid schema",
};

function statusCell(tool) {
  return el("span", { class: `pin pin-${tool.status}`, "data-testid": "tool-status", text: STATUS_WORDS[tool.status] || tool.status });
}

function hints(annotations) {
  const names = Object.entries(annotations || {}).filter(([, v]) => v !== null && v !== undefined);
  if (!names.length) return el("span", { class: "muted", text: "none" });
  return el("span", { class: "muted small", title: "the server's hints; not believed", text: names.map(([k, v]) => `${k}: ${v}`).join(", ") });
}

function acceptButton(server, tool) {
  const button = el("button", { type: "button", class: "primary", text: "Accept", "aria-label": `Accept the new definition of ${tool.name}` });
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      await api(`/api/v1/mcp-servers/${server.id}/tools/${encodeURIComponent(tool.name)}/accept/`, {
        method: "POST", body: { definition_sha256: tool.definition_sha256 },
      });
      problem("");
      say(`Accepted the new definition of ${tool.name}.`);
      await load();
    } catch (error) {
      button.disabled = false;
      problem(error instanceof ApiError && error.status === 409
        ? `${tool.name} changed again since this page loaded: review it again.`
        : `Could not accept ${tool.name}: ${error.message}`);
      await load();
    }
  });
  return button;
}

function definitionCell(tool) {
  if (tool.status !== "changed") return el("td", { text: tool.accepted_description });
  return el("td", {},
    el("div", { class: "small" }, el("strong", { text: "Accepted: " }), tool.accepted_description),
    el("div", { class: "small", "data-testid": "listed-now" }, el("strong", { text: "Listed now: " }), tool.description),
    el("details", { class: "small" }, el("summary", { text: "Input schemas" }),
      el("pre", { text: `accepted ${JSON.stringify(tool.accepted_input_schema, null, 2)}\n\nnow ${JSON.stringify(tool.input_schema, null, 2)}` })),
  );
}

function toolRow(server, tool) {
  const approval = tool.requires_approval ? "always" : "by policy";
  return el("tr", { "data-tool": tool.name },
    el("td", {}, el("code", { text: tool.name }), el("div", { class: "muted small", text: tool.ref })),
    el("td", {}, statusCell(tool)),
    definitionCell(tool),
    el("td", { text: tool.effect || "unknown (treated as an irreversible write)" }),
    el("td", { text: approval }),
    el("td", {}, hints(tool.annotations)),
    canWrite ? el("td", { class: "actions" }, tool.status === "changed" ? acceptButton(server, tool) : "") : null,
  );
}

function refreshButton(server) {
  const button = el("button", { type: "button", text: "Refresh", "aria-label": `Refresh the tools of ${server.name}` });
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const changes = await api(`/api/v1/mcp-servers/${server.id}/refresh/`, { method: "POST" });
      const parts = ["added", "changed", "removed", "restored", "invalid"]
        .filter((k) => changes[k].length).map((k) => `${k}: ${changes[k].join(", ")}`);
      say(`Refreshed ${server.name}${parts.length ? ` (${parts.join("; ")})` : ": nothing changed"}.`);
      problem("");
    } catch (error) {
      const fields = error instanceof ApiError ? Object.values(error.fields) : [];
      const detail = fields.flat().join(" ") || error.message;
      problem(`Could not refresh ${server.name}: ${detail}`);
    }
    await load();
  });
  return button;
}

function serverCard(server) {
  const where = server.transport === "http" ? server.url : server.command.join(" ");
  const refreshed = server.last_refresh_at
    ? `${server.last_refresh_status} ${when(server.last_refresh_at)}`
    : "never";
  const columns = ["Tool", "Pin", "Description", "Effect (tenant's)", "Approval", "Server's hints"];
  if (canWrite) columns.push("");
  return el("section", { class: "card flush", "data-server": server.slug, "aria-label": server.name },
    el("div", { class: "page-head", style: "padding: .8rem 1rem 0" },
      el("h2", { class: "h3", text: `${server.name} ` }, el("code", { class: "muted small", text: server.slug })),
      el("span", { class: "muted small", text: `${server.transport} · ${where}${server.auth_secret ? ` · auth: ${server.auth_secret}` : ""} · last refresh ${refreshed}${server.enabled ? "" : " · disabled"}` }),
      canWrite ? refreshButton(server) : null,
    ),
    server.last_refresh_error ? el("p", { class: "error small", style: "margin: .4rem 1rem", text: server.last_refresh_error }) : null,
    el("table", { class: "grid" },
      el("caption", { class: "sr-only", text: `Tools of ${server.name}` }),
      el("thead", {}, el("tr", {}, ...columns.map((c) => el("th", { scope: "col", text: c })))),
      el("tbody", {}, ...(server.tools.length
        ? server.tools.map((tool) => toolRow(server, tool))
        : [el("tr", {}, el("td", { colspan: columns.length, class: "muted", text: "No tools." }))])),
    ),
  );
}

async function load() {
  try {
    const servers = await api("/api/v1/mcp-servers/");
    list.replaceChildren(...(servers.length
      ? servers.map(serverCard)
      : [el("p", { class: "muted", text: "No MCP servers yet: admins register them through the API (POST /api/v1/mcp-servers/)." })]));
  } catch (error) {
    problem(`Could not load the MCP servers: ${error.message}`);
  }
}

await load();
