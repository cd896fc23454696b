// A model call's input or output drawn as the conversation it is: one block per
// message with its role, the text with its real newlines, each tool call (name
// and arguments) and tool result as a block of its own, long content folded.
// Reads the shapes spans carry: OpenAI-style messages (content, tool_calls,
// role "tool") as the engine stores them, and OpenTelemetry GenAI messages
// (parts of type text / tool_call / tool_call_response) as agents send them.

import { el, pretty } from "./format.js";

const FOLD_LINES = 12;
const FOLD_CHARS = 1200;
const ROLE_NAMES = { system: "System", user: "User", assistant: "Assistant", tool: "Tool result", developer: "Developer" };

// Text longer than a screenful: the first lines and a button for the rest.
export function folded(text, { testid } = {}) {
  const full = String(text ?? "");
  const lines = full.split("\n");
  const body = el("div", { class: "msg-text", "data-testid": testid });
  const long = lines.length > FOLD_LINES || full.length > FOLD_CHARS;
  if (!long) { body.textContent = full; return body; }
  const preview = lines.length > FOLD_LINES ? lines.slice(0, FOLD_LINES).join("\n") : full.slice(0, FOLD_CHARS);
  body.textContent = `${preview}…`;
  const label = lines.length > FOLD_LINES ? `Show all ${lines.length} lines` : `Show all ${full.length.toLocaleString()} characters`;
  const toggle = el("button", { type: "button", class: "link fold", "aria-expanded": "false", text: label });
  toggle.addEventListener("click", () => {
    const open = toggle.getAttribute("aria-expanded") !== "true";
    body.textContent = open ? full : `${preview}…`;
    toggle.setAttribute("aria-expanded", String(open));
    toggle.textContent = open ? "Show less" : label;
  });
  return el("div", { class: "fold-box" }, body, toggle);
}

function parseMaybe(value) {
  if (typeof value !== "string") return value;
  const t = value.trim();
  if (!(t.startsWith("{") || t.startsWith("["))) return value;
  try { return JSON.parse(t); } catch { return value; }
}

function textOf(value) {
  const parsed = parseMaybe(value);
  return typeof parsed === "string" ? parsed : pretty(parsed);
}

function toolCallBlock(name, args, id) {
  return el("div", { class: "msg-block tool-call", "data-testid": "tool-call" },
    el("div", { class: "block-head" }, el("span", { class: "muted small", text: "Tool call " }), el("code", { text: name || "?" }),
      id ? el("span", { class: "muted small", text: ` · ${id}` }) : null),
    folded(textOf(args ?? {})));
}

function toolResultBlock(content, id) {
  return el("div", { class: "msg-block tool-result", "data-testid": "tool-result" },
    el("div", { class: "block-head" }, el("span", { class: "muted small", text: `Tool result${id ? ` · ${id}` : ""}` })),
    folded(textOf(content)));
}

// The blocks of one message, whichever shape it has.
function blocksOf(message) {
  const blocks = [];
  const role = message.role || "message";
  if (Array.isArray(message.parts)) {
    for (const part of message.parts) {
      const type = part.type || "text";
      if (type === "text" || type === "reasoning") blocks.push(folded(part.content ?? part.text ?? ""));
      else if (type === "tool_call") blocks.push(toolCallBlock(part.name, part.arguments, part.id));
      else if (type === "tool_call_response") blocks.push(toolResultBlock(part.response ?? part.result, part.id));
      else blocks.push(folded(pretty(part)));
    }
  } else if (role === "tool") {
    blocks.push(toolResultBlock(message.content, message.tool_call_id));
  } else {
    const content = message.content;
    if (Array.isArray(content)) {
      for (const item of content) blocks.push(folded(typeof item === "string" ? item : item.text ?? pretty(item)));
    } else if (content != null && content !== "") {
      blocks.push(folded(typeof content === "string" ? content : pretty(content)));
    }
  }
  for (const call of message.tool_calls || []) {
    const fn = call.function || {};
    blocks.push(toolCallBlock(fn.name ?? call.name, fn.arguments ?? call.raw_arguments ?? call.arguments, call.id ?? call.call_id));
  }
  if (!blocks.length) blocks.push(el("p", { class: "muted small", text: "(empty)" }));
  return blocks;
}

function messagesOf(value) {
  const v = parseMaybe(value);
  if (Array.isArray(v) && v.every((m) => m && typeof m === "object" && ("role" in m || "parts" in m))) return v;
  if (v && typeof v === "object" && Array.isArray(v.messages)) return messagesOf(v.messages);
  if (v && typeof v === "object" && "role" in v) return [v];
  return null;
}

// The conversation, or null when the value is not a list of messages (the
// caller shows it as JSON).
export function conversation(value, { testid } = {}) {
  const messages = messagesOf(value);
  if (!messages) return null;
  return el("div", { class: "conversation", "data-testid": testid },
    ...messages.map((message) => {
      const role = message.role || "message";
      const finish = message.finish_reason ? el("span", { class: "muted small", text: ` · ${message.finish_reason}` }) : null;
      return el("article", { class: `msg role-${role}`, "aria-label": `${ROLE_NAMES[role] || role} message` },
        el("header", { class: "msg-role" }, el("strong", { text: ROLE_NAMES[role] || role }), finish),
        ...blocksOf(message));
    }));
}
