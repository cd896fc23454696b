// The inbox's "Flagged for review": runs a guardrail stopped (it tripped, or
// its model could not be asked and it failed closed), and runs an `escalate`
// hook handed to a person when their budget ran out. Each shows what the
// customer wrote, which guardrail stopped it and why, the refusal sent, and a
// "Mark reviewed" button for those who may decide approvals.

import { api, rowsOf } from "./api.js";
import { el, when } from "./format.js";

const root = document.getElementById("reviews-root");
const canDecide = root.dataset.canDecide === "1";
const list = document.getElementById("reviews");
const empty = document.getElementById("reviews-empty");
const error = document.getElementById("reviews-error");

const VERDICT = { tripped: "tripped", unavailable: "could not run (failed closed)" };

function card(review) {
  const verdict = VERDICT[review.verdict] || review.verdict;
  const what = review.verdict === "escalated"
    ? `escalated to a person by “${review.guardrail}” (${review.stop_reason})`
    : `${review.stage} guardrail “${review.guardrail}” ${verdict}`;
  const item = el("li", { class: "card review", "data-review": review.id },
    el("p", {},
      el("strong", { text: what }),
      " · ",
      el("a", { href: `/runs/${review.run}/`, text: `run of ${review.agent}` }),
      el("span", { class: "muted small", text: ` · ${when(review.created_at)}` })),
    el("p", { class: "small", text: `Why: ${review.reason}` }),
    el("blockquote", { class: "small", text: review.input }),
    el("p", { class: "small muted", text: `Answered: ${review.final_answer}` }));
  if (canDecide) {
    const button = el("button", { type: "button", text: "Mark reviewed" });
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        await api(`/api/v1/reviews/${review.id}/reviewed/`, { method: "POST" });
        item.remove();
      } catch (e) {
        if (e.status === 409) item.remove();
        else { button.disabled = false; showError(e.message); }
      }
      empty.hidden = list.children.length > 0;
    });
    item.append(button);
  }
  return item;
}

function showError(message) {
  error.textContent = message;
  error.hidden = false;
}

async function load() {
  try {
    const reviews = rowsOf(await api("/api/v1/reviews/?status=open"));
    list.replaceChildren(...reviews.map(card));
    empty.hidden = reviews.length > 0;
  } catch (e) {
    showError(`Flagged runs could not be loaded: ${e.message}`);
  }
}

// Flagged or reviewed elsewhere: the inbox's tenant stream says so.
let reloading = null;
window.addEventListener("reviews:changed", () => {
  clearTimeout(reloading);
  reloading = setTimeout(load, 200); // a burst of flags is one reload
});
load();
