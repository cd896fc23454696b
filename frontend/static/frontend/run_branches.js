// The run page's session branches (docs/ui.md "Branches"): the Retry button
// (operators; a run that ended without succeeding) and the "Branches" list of
// the session's runs (the original, its retries and forks) with their status
// and where each branched; a branch's link opens that run's page and trace.

import { api } from "./api.js";
import { el, statusBadge } from "./format.js";

const root = document.getElementById("run-root");
const runId = root.dataset.runId;
// runs.services.branches.RETRYABLE_STATUSES
const RETRYABLE = new Set(["failed", "budget_exhausted", "policy_blocked", "unverified", "cancelled"]);
const KIND = { root: "Original", retry: "Retry", fork: "Fork", recovery: "Recovery" };
const retry = document.getElementById("retry-run");
const box = document.getElementById("branches");
const list = document.getElementById("branch-list");

function label(branch) {
  const name = branch.kind === "root" ? KIND.root : `${KIND[branch.kind]} #${branch.number}`;
  return `${name} · run ${branch.run.slice(0, 8)}`;
}

function origin(branch) {
  if (!branch.branch_of) return null;
  const edit = branch.edit ? `, ${branch.edit.field.replace("_", " ")} of entry ${branch.edit.target} edited` : "";
  return el("span", { class: "muted small", text: ` from run ${branch.branch_of.slice(0, 8)} after entry ${branch.from_entry}${edit}` });
}

async function loadBranches() {
  let rows;
  try {
    rows = await api(`/api/v1/runs/${runId}/branches/`);
  } catch {
    return; // the trace page works without it; the next status change tries again
  }
  const self = rows.find((branch) => branch.current);
  if (retry && self) retry.hidden = !RETRYABLE.has(self.status);
  box.hidden = rows.length < 2;
  list.replaceChildren(...rows.map((branch) => el("li",
    { "data-testid": "branch", "data-kind": branch.kind, "data-run": branch.run, "aria-current": branch.current ? "page" : null },
    branch.current ? el("strong", { text: label(branch) }) : el("a", { href: `/runs/${branch.run}/`, text: label(branch) }),
    " ", statusBadge(branch.status), origin(branch))));
}

retry?.addEventListener("click", async () => {
  retry.disabled = true;
  const problem = document.getElementById("run-error");
  try {
    const made = await api(`/api/v1/runs/${runId}/retry/`, { method: "POST" });
    window.location.assign(`/runs/${made.id}/`);
  } catch (error) {
    problem.textContent = `Could not retry: ${error.message}`;
    problem.hidden = false;
    retry.disabled = false;
    loadBranches();
  }
});

// The run page redraws its status badge as the run moves: the list and the
// button follow it (only when the status itself changed).
let shown = "";
const status = document.getElementById("run-status");
new MutationObserver(() => {
  if (status.textContent === shown) return;
  shown = status.textContent;
  loadBranches();
}).observe(status, { childList: true, subtree: true, characterData: true });
loadBranches();
