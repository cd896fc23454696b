// A labelled meter: a bar plus the figures in words (never colour alone).

import { el } from "./format.js";


export function gauge(label, used, cap, fmt = String) {
  const ratio = cap ? Math.min(1, used / cap) : 0;
  const pct = Math.round(ratio * 100);
  const level = ratio >= 1 ? "over" : ratio >= 0.8 ? "high" : "ok";
  const text = cap ? `${fmt(used)} of ${fmt(cap)} (${pct}%)${level === "over" ? " — limit reached" : level === "high" ? " — near limit" : ""}` : `${fmt(used)} (no cap)`;
  return el("div", { class: `gauge g-${level}` },
    el("span", { class: "g-label", text: label }),
    el("span", { class: "g-track", role: "meter", "aria-label": label, "aria-valuemin": "0", "aria-valuemax": String(cap || 0), "aria-valuenow": String(used), "aria-valuetext": text },
      el("span", { class: "g-fill", style: `width:${cap ? pct : 0}%` })),
    el("span", { class: "g-text", text }));
}
