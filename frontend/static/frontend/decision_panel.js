// The run page's decision controls: the approval form in the span panel (edit
// the arguments, the scope, a reason; an edit is shown as a diff and confirmed
// before anything is sent) and, on a phone, the bar fixed to the bottom of the
// screen while a decision is pending.

import { approvalLabel, el, timeLeft } from "./format.js";
import { canonical, diffView } from "./decisions.js";

// What was typed in an approval's form survives the panel being drawn again
// (a span event, the payload fetch) until the approval is decided.
const drafts = new Map();

function draftOf(approval) {
  const original = JSON.stringify(approval.args ?? {}, null, 2);
  if (!drafts.has(approval.id)) drafts.set(approval.id, { args: original, scope: "once", reason: "", confirming: null, error: "" });
  return drafts.get(approval.id);
}

export function forgetDraft(approvalId) {
  drafts.delete(approvalId);
}

// Parse the draft: {args} (undefined when unchanged), or {error}.
function parsedDraft(approval, draft) {
  const original = JSON.stringify(approval.args ?? {}, null, 2);
  if (draft.args.trim() === original.trim()) return { args: undefined };
  let edited;
  try { edited = JSON.parse(draft.args); } catch (error) { return { error: `Not valid JSON: ${error.message}` }; }
  if (canonical(edited) === canonical(approval.args ?? {})) return { args: undefined };
  return { args: edited };
}

// `approve(extra, button)` sends {args, scope, reason, onFieldErrors}; `deny(button)`;
// `redraw()` draws the panel again (the confirm step is part of the draft).
export function approvalForm(approval, { approve, deny, redraw }) {
  const draft = draftOf(approval);
  const label = approvalLabel(approval);
  const args = el("textarea", { id: "approve-args", rows: "5", class: "args", "aria-describedby": "approve-args-error", oninput: () => { draft.args = args.value; draft.confirming = null; } });
  args.value = draft.args;
  const argsError = el("p", { class: "field-error", id: "approve-args-error", role: "alert" });
  // The draft keeps its error too: the panel may be drawn again (a live event)
  // while the person reads it.
  const showError = (text) => {
    draft.error = text;
    argsError.textContent = text;
    if (text) args.setAttribute("aria-invalid", "true");
    else args.removeAttribute("aria-invalid");
  };
  showError(draft.error || "");
  const scope = el("select", { id: "approve-scope", onchange: () => { draft.scope = scope.value; } },
    el("option", { value: "once", text: "once: this call only" }),
    el("option", { value: "run", text: "run: later calls of this tool in this run" }));
  scope.value = draft.scope;
  const reason = el("input", { id: "approve-reason", type: "text", placeholder: "optional", oninput: () => { draft.reason = reason.value; } });
  reason.value = draft.reason;
  const fieldErrors = (error) => {
    const fields = error.fields || {};
    const text = (v) => (Array.isArray(v) ? v.join(" ") : String(v));
    showError(fields.args ? text(fields.args) : Object.entries(fields).map(([k, v]) => `${k}: ${text(v)}`).join(" ") || error.message);
    draft.confirming = null;
  };
  const send = (button, scopeValue, edited) => approve({ args: edited, scope: scopeValue, reason: draft.reason.trim(), onFieldErrors: fieldErrors }, button);
  const submit = (button, scopeValue) => {
    showError("");
    const parsed = parsedDraft(approval, draft);
    if (parsed.error) {
      showError(parsed.error);
      args.focus();
      return;
    }
    draft.scope = scopeValue;
    if (parsed.args === undefined) { send(button, scopeValue, undefined); return; }
    // Edited: show what changes and send only on confirmation.
    draft.confirming = scopeValue;
    redraw();
  };
  const form = el("div", { class: "approve-form" },
    el("label", { for: "approve-args", text: "Arguments (edit to change what runs)" }), args, argsError,
    el("label", { for: "approve-scope", text: "Scope" }), scope,
    el("label", { for: "approve-reason", text: "Reason for approving" }), reason);
  const parsed = draft.confirming ? parsedDraft(approval, draft) : null;
  if (parsed && parsed.args !== undefined) {
    const confirm = el("section", { class: "confirm-edit", role: "group", "aria-labelledby": "confirm-edit-title" },
      el("h4", { id: "confirm-edit-title", text: `Approve ${label} with these changes${draft.confirming === "run" ? ", for the whole run" : ""}?` }),
      diffView(approval.args ?? {}, parsed.args),
      el("div", { class: "buttons" },
        el("button", { type: "button", text: "Back to editing", onclick: () => { draft.confirming = null; redraw(); document.getElementById("approve-args")?.focus(); } }),
        el("button", { type: "button", class: "approve", id: "confirm-approve", text: "✓ Confirm approval", onclick: (e) => send(e.target, draft.confirming, parsed.args) })));
    form.append(confirm);
    queueMicrotask(() => document.getElementById("confirm-approve")?.focus());
  } else {
    form.append(el("div", { class: "buttons" },
      el("button", { type: "button", class: "approve", "aria-label": `Approve ${approval.tool} (panel)`, text: "✓ Approve", onclick: (e) => submit(e.target, scope.value) }),
      el("button", { type: "button", class: "approve run-scope", "aria-label": `Approve for the whole run: ${approval.tool}`, text: "✓ Approve for the whole run", onclick: (e) => submit(e.target, "run") }),
      el("button", { type: "button", class: "deny", "aria-label": `Deny ${approval.tool} (panel)`, text: "✕ Deny", onclick: (e) => deny(e.target) })));
  }
  return form;
}

// The bar at the bottom of a phone's screen while a decision waits (CSS shows
// it under 700 px only). Approve with an edited draft opens the panel's confirm
// step instead of sending.
export function renderDecisionBar(pending, { canDecide, approve, deny, review }) {
  const bar = document.getElementById("decision-bar");
  if (!bar) return;
  const approval = canDecide ? pending[0] : null;
  bar.hidden = !approval;
  document.body.classList.toggle("deciding", Boolean(approval));
  if (!approval) { bar.replaceChildren(); return; }
  const label = approvalLabel(approval);
  const more = pending.length > 1 ? ` (+${pending.length - 1} more)` : "";
  bar.replaceChildren(
    el("p", { class: "what" }, el("span", { "aria-hidden": "true", text: "‖ " }), el("strong", { text: label }), ` waits for you · ${timeLeft(approval.expires_at)}${more}`),
    el("button", { type: "button", class: "approve", "aria-label": `Approve ${label} (bar)`, text: "✓ Approve", onclick: (e) => {
      const draft = drafts.get(approval.id);
      const parsed = draft && approval.kind === "tool_call" ? parsedDraft(approval, draft) : { args: undefined };
      if (parsed.error || parsed.args !== undefined) {
        if (draft && !parsed.error) draft.confirming = draft.scope;
        review(approval);
        return;
      }
      approve(approval, { scope: draft?.scope, reason: draft?.reason.trim() }, e.target);
    } }),
    el("button", { type: "button", class: "deny", "aria-label": `Deny ${label} (bar)`, text: "✕ Deny", onclick: (e) => deny(approval, e.target) }),
    approval.kind === "tool_call" ? el("button", { type: "button", class: "link", text: "Review", "aria-label": `Review ${label}`, onclick: () => review(approval) }) : null);
}
