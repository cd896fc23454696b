// Formatting of eval figures shared by the eval pages: rates as percentages,
// intervals, signed deltas.

export function pct(rate, digits = 0) {
  if (rate == null || rate === "" || Number.isNaN(Number(rate))) return "–";
  return `${(Number(rate) * 100).toFixed(digits)}%`;
}

// "62% (95% CI 41–80%)"
export function rateWithInterval(rate, low, high, confidence = 0.95) {
  if (rate == null) return "–";
  if (low == null || high == null || low === "" || high === "") return pct(rate);
  return `${pct(rate)} (${pct(confidence)} CI ${pct(low)}–${pct(high)})`;
}

// Points for rate deltas (+12.5 pts), plain signed numbers otherwise.
export function signedPoints(delta) {
  const points = Number(delta) * 100;
  const text = Math.abs(points) < 10 && points % 1 ? points.toFixed(1) : points.toFixed(0);
  return `${points > 0 ? "+" : points < 0 ? "−" : "±"}${text.replace("-", "")} pts`;
}

export function signed(value, format = (v) => String(v)) {
  const n = Number(value);
  if (!n) return `±${format(0)}`;
  return `${n > 0 ? "+" : "−"}${format(Math.abs(n))}`;
}

// Rewrites the server-rendered `.rate` spans (fractions) as percentages, with
// the interval where the element carries one.
export function formatRates(root = document) {
  for (const node of root.querySelectorAll(".rate[data-rate]")) {
    const { rate, low, high } = node.dataset;
    node.textContent = low && high && low !== "None" ? rateWithInterval(rate, low, high) : pct(rate);
  }
}
