// One period limit's burn-down (what is left of the limit over the period, and
// where the period's average rate takes it) or, with no limit, the use so far;
// with the forecast in words. Used by the overview and the budget page.

import { el, money } from "./format.js";
import { timeChart } from "./charts.js";

export const PERIOD_LABEL = { day: "Today", month: "This month" };
export const DIM_LABEL = { cost: "Cost", input_tokens: "Input tokens", output_tokens: "Output tokens", runs: "Runs" };
const STEP_MS = { hour: 3600e3, day: 86400e3 };

export const fmtDim = (name) => (name === "cost" ? money : (v) => Math.round(Number(v)).toLocaleString());

function clock(iso, period) {
  const d = new Date(iso);
  return period === "day"
    ? d.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" })
    : d.toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
}

// The sentence a person reads under the chart.
export function forecastText(period, name, dim, rolling) {
  const fmt = fmtDim(name);
  const f = dim.forecast;
  const used = `${fmt(dim.used)} used${Number(dim.reserved) ? `, ${fmt(dim.reserved)} reserved` : ""}`;
  if (dim.limit == null) return `${used}; no limit set.`;
  const of = `${used} of ${fmt(dim.limit)}.`;
  switch (f.state) {
    case "exhausted": return `${of} Limit reached.`;
    case "idle": return `${of} Nothing spent yet: lasts the period.`;
    case "lasts": return `${of} At this rate it lasts ${rolling ? "the window" : "the period"}.`;
    case "runs_out": return `${of} At this rate it runs out at ${clock(f.runs_out_at, period)}.`;
    default: return of;
  }
}

// A chart for one (period, dimension) of the burn-down body: left of the limit
// up to now, then the forecast (dashed) to the period's end.
export function burnChart(box, { period, name, body, mode, onPick, height = 150 }) {
  const dim = body.dimensions[name];
  const limited = dim.limit != null;
  const buckets = [...body.buckets];
  const values = dim.cumulative.map((c) => (limited ? Math.max(Number(dim.limit) - c, 0) : c));
  const forecast = values.map(() => null);
  if (limited && mode !== "rolling" && values.length) {
    forecast[forecast.length - 1] = values[values.length - 1];
    const rate = dim.forecast.rate_per_hour;
    const end = new Date(body.end).getTime();
    const step = STEP_MS[body.step];
    for (let t = new Date(buckets[buckets.length - 1]).getTime() + step; t < end; t += step) {
      buckets.push(new Date(t).toISOString());
      values.push(null);
      const hours = (t - Date.now()) / 3600e3;
      forecast.push(Math.max(values.findLast((v) => v != null) - rate * Math.max(hours, 0), 0));
    }
  }
  const series = [{ label: limited ? "Left" : "Used", colour: "#2f6fdd", values }];
  if (limited && mode !== "rolling") series.push({ label: "Forecast", colour: "#c98a00", values: forecast, dash: [6, 4] });
  const title = `${PERIOD_LABEL[period]}: ${DIM_LABEL[name]}`;
  const wrap = el("div", { class: "burn", "data-period": period, "data-dimension": name },
    el("h3", { class: "h3", text: title }),
    el("p", { class: "small forecast", "data-testid": `forecast-${period}-${name}`, text: forecastText(period, name, dim, mode === "rolling") }));
  const plot = el("div");
  wrap.append(plot);
  box.append(wrap);
  return timeChart(plot, { label: `${title}, ${limited ? "left of the limit" : "used so far"}`, buckets, series, fmt: fmtDim(name), onPick, height });
}
