// The inbox's "Questions": what running agents asked a person (the ask_human
// tool, or an MCP server's elicitation). Each card, marked "Question", shows
// the question, the agent and its run, and how long it may wait; those who may
// decide approvals answer with one of the offered choices (a button each) or
// in a text box. The list follows the tenant stream (approvals_page.js sends
// "questions:changed" for every question.* event).

import { api, rowsOf } from "./api.js";
import { el, timeLeft, when } from "./format.js";
import { showMessage } from "./decisions.js";

const root = document.getElementById("questions-root");
const canAnswer = root.dataset.canDecide === "1";
const list = document.getElementById("questions");
const empty = document.getElementById("questions-empty");
const error = document.getElementById("questions-error");
const ENDED = new Set(["succeeded", "failed", "unverified", "budget_exhausted", "policy_blocked", "cancelled"]);
const busy = new Set();

function message(text, kind = "error") {
  showMessage(error, text ? { text } : null, kind);
}

async function answer(question, value, controls) {
  if (busy.has(question.id)) return;
  busy.add(question.id);
  for (const c of controls) c.disabled = true;
  try {
    const done = await api(`/api/v1/questions/${question.id}/answer/`, { method: "POST", body: { answer: value } });
    message(`Answered “${done.answer}”: the run goes on.`, "notice");
  } catch (e) {
    const field = e.body?.error?.fields?.answer || e.body?.answer;
    message(`Not answered: ${field ? [].concat(field).join(" ") : e.message}`);
    for (const c of controls) c.disabled = false;
  } finally {
    busy.delete(question.id);
  }
  load();
}

function card(q) {
  const label = q.kind === "elicitation" ? `${q.tool} asks` : "The agent asks";
  const item = el("li", { class: "inbox-item question", "data-question": q.id, "aria-label": `Question from ${q.agent} in run ${q.run.slice(0, 8)}` },
    el("div", { class: "inbox-head" },
      el("span", { class: "status s-waiting_input" }, el("span", { "aria-hidden": "true", text: "?" }), " Question"),
      el("a", { href: `/runs/${q.run}/#call=${encodeURIComponent(q.tool_call_id)}`, text: `run ${q.run.slice(0, 8)} → trace` }),
      el("span", { class: "agent-name", text: q.agent }),
      el("span", { class: "muted small", text: `asked ${when(q.asked_at)}` }),
      el("span", { class: "left", "data-expires": q.expires_at, text: timeLeft(q.expires_at) })),
    el("p", { class: "ctx-label", text: label }),
    el("blockquote", { class: "question-text", "data-testid": "question-text", text: q.question }));
  if (!canAnswer) return item;
  if (q.choices.length) {
    const buttons = q.choices.map((choice) => el("button", { type: "button", class: "choice", text: choice, "aria-label": `Answer ${choice}` }));
    buttons.forEach((b, i) => b.addEventListener("click", () => answer(q, q.choices[i], buttons)));
    item.append(el("div", { class: "buttons", role: "group", "aria-label": "Choices" }, ...buttons));
  } else {
    const id = `answer-${q.id}`;
    const box = el("textarea", { id, rows: "2", maxlength: "10000", "aria-label": "Your answer" });
    const send = el("button", { type: "submit", class: "approve", text: "Send answer" });
    const form = el("form", { class: "answer-form" }, el("label", { for: id, class: "small", text: "Your answer" }), box, el("div", { class: "buttons" }, send));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      if (!box.value.trim()) { message("Write an answer first."); box.focus(); return; }
      answer(q, box.value, [box, send]);
    });
    item.append(form);
  }
  return item;
}

async function load() {
  try {
    const rows = rowsOf(await api("/api/v1/questions/?state=pending&limit=200"))
      .filter((q) => !ENDED.has(q.run_status))
      .sort((a, b) => Date.parse(a.asked_at) - Date.parse(b.asked_at));
    // A card being typed into stays as it is.
    const typing = list.querySelector("textarea:focus")?.closest("[data-question]")?.dataset.question;
    const kept = new Map([...list.children].map((li) => [li.dataset.question, li]));
    list.replaceChildren(...rows.map((q) => (q.id === typing && kept.has(q.id) ? kept.get(q.id) : card(q))));
    empty.hidden = rows.length > 0;
    root.hidden = false;
  } catch (e) {
    message(`Could not load questions: ${e.message}`);
  }
}

let timer = null;
window.addEventListener("questions:changed", () => { clearTimeout(timer); timer = setTimeout(load, 200); });
load();
