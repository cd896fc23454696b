// Deciding an approval, shared by the run page and the inbox: the POST, the
// messages a person can act on when it fails (already decided elsewhere: by
// whom; session expired: log in again and come back to this decision), and the
// diff of edited arguments shown before an edited approval is confirmed.

import { api, ApiError, holdLoginRedirect } from "./api.js";
import { approvalLabel, el, when } from "./format.js";

// POST a decision. 401 is not turned into a redirect here: the page says what
// happened and offers the way back (see decisionFailure).
export function postDecision(approval, body) {
  return api(`/api/v1/approvals/${approval.id}/decide/`, { method: "POST", body, redirectOn401: false });
}

export function sessionExpired(error) {
  return error instanceof ApiError && (error.status === 401 || (error.status === 403 && error.code === "not_authenticated"));
}

// Where a person returns after logging in again: this page, at this decision.
export function loginToReturn(returnTo) {
  return `/login/?next=${encodeURIComponent(returnTo)}`;
}

// What a failed decision tells the person: {text, link?, current?}.
export function decisionFailure(error, approval, returnTo) {
  if (sessionExpired(error)) {
    holdLoginRedirect();
    return {
      text: `Your session has expired, so nothing was decided on ${approvalLabel(approval)}. Log in again to decide: you will come back to this decision.`,
      link: { href: loginToReturn(returnTo), text: "Log in again" },
    };
  }
  if (error instanceof ApiError && error.status === 409) {
    const current = error.body?.error?.approval;
    if (!current) return { text: `Already decided: ${error.message}.` };
    const who = current.decided_by ? ` by ${current.decided_by}` : current.status === "expired" ? " (its time ran out)" : "";
    const at = current.decided_at ? ` at ${when(current.decided_at)}` : "";
    const why = current.reason && current.reason !== "expired" ? `: “${current.reason}”` : "";
    return { text: `Already decided: ${current.status}${who}${at}${why}. Your decision was not recorded.`, current };
  }
  if (error instanceof ApiError && error.status === 403) {
    return { text: `You may not decide this: ${error.message}` };
  }
  return { text: `The decision failed: ${error.message}` };
}

// Show a message (and a link, if any) in a role=alert box.
export function showMessage(box, message, kind = "error") {
  if (!message) { box.hidden = true; box.replaceChildren(); return; }
  box.hidden = false;
  box.className = kind;
  box.replaceChildren(message.text);
  if (message.link) box.append(" ", el("a", { href: message.link.href, class: "login-again", text: message.link.text }));
}

// ---- arguments diff -----------------------------------------------------------

export function canonical(value) {
  return JSON.stringify(sortKeys(value), null, 2);
}

function sortKeys(value) {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.keys(value).sort().map((k) => [k, sortKeys(value[k])]));
  }
  return value;
}

// A line diff (longest common subsequence) of two values' pretty JSON.
export function diffLines(before, after) {
  const a = canonical(before).split("\n");
  const b = canonical(after).split("\n");
  const n = a.length, m = b.length;
  const common = Array.from({ length: n + 1 }, () => new Array(m + 1).fill(0));
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      common[i][j] = a[i] === b[j] ? common[i + 1][j + 1] + 1 : Math.max(common[i + 1][j], common[i][j + 1]);
    }
  }
  const lines = [];
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] === b[j]) { lines.push({ op: " ", text: a[i] }); i++; j++; }
    else if (j < m && (i === n || common[i][j + 1] >= common[i + 1][j])) { lines.push({ op: "+", text: b[j] }); j++; }
    else { lines.push({ op: "-", text: a[i] }); i++; }
  }
  return lines;
}

// The diff as a person reads it: removed lines marked "−", added "+".
export function diffView(before, after, testid = "args-diff") {
  const lines = diffLines(before, after);
  const removed = lines.filter((l) => l.op === "-").length;
  const added = lines.filter((l) => l.op === "+").length;
  return el("div", { class: "diff-box" },
    el("p", { class: "small", text: `${removed} line${removed === 1 ? "" : "s"} removed, ${added} added` }),
    el("pre", { class: "diff", "data-testid": testid, tabindex: "0", "aria-label": "Changes to the arguments" },
      ...lines.map((l) => el("span", {
        class: l.op === "+" ? "add" : l.op === "-" ? "del" : "same",
        text: `${l.op === "-" ? "−" : l.op} ${l.text}\n`,
      }))));
}
