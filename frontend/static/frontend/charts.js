// Time-series charts drawn by uPlot (vendored, vendor/README.md). A chart is a
// canvas plus what a person reads without it: uPlot's legend (the values at the
// cursor) and a data table (`<details>`), so every figure is also text.
// A click on the plot picks the bucket under the cursor (and the series nearest
// to it): the pages turn that into a link to the filtered runs list.

import uPlot from "./vendor/uPlot.esm.js";
import { el } from "./format.js";

export const STATUS_COLOURS = {
  queued: "#8a8f98", running: "#2f6fdd", waiting_approval: "#c98a00", waiting_input: "#c98a00", succeeded: "#1f8a4c",
  failed: "#c62828", unverified: "#7b5ea7", budget_exhausted: "#d35400", policy_blocked: "#6d4c41",
  cancelled: "#5f6b7a",
};

const seconds = (iso) => new Date(iso).getTime() / 1000;

// series: [{label, colour, values: [..per bucket], dash?, bars?}]; fmt(value) -> text.
export function timeChart(box, { label, buckets, series, fmt = String, onPick, height = 200 }) {
  const figure = el("figure", { class: "chart", "aria-label": label });
  const plot = el("div", { class: "chart-plot" });
  const table = el("table", { class: "chart-table small" });
  const details = el("details", { class: "chart-data" }, el("summary", { text: "Data" }), table);
  figure.append(plot, details);
  box.replaceChildren(figure);
  let current = { buckets, series };
  let pickedSeries = null;

  const opts = {
    width: Math.max(280, box.clientWidth || 600),
    height,
    legend: { live: true },
    cursor: { points: { size: 6 }, focus: { prox: 24 } },
    focus: { alpha: 0.4 },
    // Counts, durations and what is left all start at zero (a burn-down read
    // from an axis cut at $4 would look empty).
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.08 : 1] } },
    axes: [{}, { values: (u, ticks) => ticks.map((t) => fmt(t)), size: 64 }],
    series: [
      { label: "Time", value: (u, v) => (v == null ? "–" : new Date(v * 1000).toLocaleString(undefined, { dateStyle: "short", timeStyle: "short" })) },
      ...series.map((s) => ({
        label: s.label, stroke: s.colour, width: 2, dash: s.dash, spanGaps: false,
        fill: s.bars ? `${s.colour}33` : undefined,
        paths: s.bars ? uPlot.paths.bars({ size: [0.8, 24] }) : undefined,
        points: { show: true, size: 4 },
        value: (u, v) => (v == null ? "–" : fmt(v)),
      })),
    ],
    hooks: { setSeries: [(u, idx) => { pickedSeries = idx; }] },
  };
  const chart = new uPlot(opts, toData(current), plot);
  chart.over.addEventListener("click", () => {
    const idx = chart.cursor.idx;
    if (idx == null || !onPick) return;
    onPick(idx, pickedSeries ? pickedSeries - 1 : null);
  });
  chart.over.style.cursor = onPick ? "pointer" : "default";
  // The table is built when opened (a month of hours is 720 rows).
  details.addEventListener("toggle", () => { if (details.open) renderTable(); });
  const resize = new ResizeObserver(() => chart.setSize({ width: Math.max(280, box.clientWidth), height }));
  resize.observe(box);

  function toData({ buckets, series }) {
    return [buckets.map(seconds), ...series.map((s) => s.values)];
  }

  function renderTable() {
    const head = el("tr", {}, el("th", { scope: "col", text: "Time (UTC)" }), ...current.series.map((s) => el("th", { scope: "col", class: "num", text: s.label })));
    const rows = current.buckets.map((b, i) => {
      if (current.series.every((s) => !s.values[i])) return null;
      return el("tr", {}, el("th", { scope: "row", text: b.slice(0, 16).replace("T", " ") }),
        ...current.series.map((s) => el("td", { class: "num", text: s.values[i] == null ? "–" : fmt(s.values[i]) })));
    }).filter(Boolean);
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...(rows.length ? rows : [el("tr", {}, el("td", { colspan: String(current.series.length + 1), text: "Nothing in this period." }))])));
  }

  return {
    chart,
    // Same series, new values: redraw in place (no new canvas, no layout).
    update(next) {
      current = next;
      chart.setData(toData(current));
      if (details.open) renderTable();
    },
    destroy() { resize.disconnect(); chart.destroy(); },
  };
}
