// The trace's time axis: labelled ticks over the timeline column, zoom to a
// span (click its bar, or `z`; Shift+Z or "Whole run" goes back), the time the
// run waited for a person, and above a large trace a minimap of the whole run
// (span density, errors, waits) where a click or a drag picks the window.

import { duration } from "./format.js";

export const LARGE_TRACE = 200; // spans: a minimap above traces this large
const NICE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 15_000, 30_000,
  60_000, 120_000, 300_000, 600_000, 900_000, 1_800_000, 3_600_000, 7_200_000, 21_600_000, 86_400_000];

// "0 s", "250 ms", "1.5 s", "2m 30s": compact, for tick labels.
export function tickLabel(ms) {
  if (ms === 0) return "0 s";
  if (Math.abs(ms) < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${Number.isInteger(s) ? s : s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  const rest = Math.round(s % 60);
  if (m < 60) return rest ? `${m}m ${rest}s` : `${m}m`;
  return `${Math.floor(m / 60)}h ${m % 60}m`;
}

export function ticks(t0, t1, origin, count = 5) {
  const range = Math.max(1, t1 - t0);
  const step = NICE.find((n) => n >= range / count) ?? NICE[NICE.length - 1];
  const out = [];
  for (let t = Math.ceil((t0 - origin) / step) * step; origin + t <= t1; t += step) {
    out.push({ at: ((origin + t - t0) / range) * 100, label: tickLabel(t) });
  }
  return out;
}

export class TimeAxis {
  // parts: ticks (element over the timeline column), label (zoom state),
  // reset (button), minimap (canvas), waiting (element for the run's wait).
  constructor({ view, model, parts }) {
    Object.assign(this, { view, model, ...parts });
    this.drawn = "";
    this.mapAt = 0;
    this.reset.addEventListener("click", () => this.zoomOut());
    this.minimap.addEventListener("pointerdown", (e) => this.pickStart(e));
    this.minimap.addEventListener("pointerup", (e) => this.pickEnd(e));
    this.minimap.addEventListener("keydown", (e) => {
      if (e.key === "Escape" || e.key === "0") { this.zoomOut(); e.preventDefault(); }
    });
  }

  zoomTo(node) {
    const s = node.s;
    const start = Date.parse(s.started_at);
    const end = s.ended_at ? Date.parse(s.ended_at) : Date.now();
    if (this.view.zoom?.id === node.id) { this.zoomOut(); return; }
    const pad = Math.max(1, (end - start) * 0.02);
    this.view.zoom = { t0: start - pad, t1: end + pad, id: node.id, name: s.name };
    this.view.schedule();
  }

  zoomWindow(t0, t1) {
    const whole = this.view.axis;
    const lo = Math.max(whole.whole0, Math.min(t0, t1));
    const hi = Math.min(whole.whole1, Math.max(t0, t1));
    if (hi - lo < 1) return;
    this.view.zoom = { t0: lo, t1: hi, id: null, name: null };
    this.view.schedule();
  }

  zoomOut() {
    this.view.zoom = null;
    this.view.schedule();
  }

  // After each render of the tree: ticks and labels when the axis moved, the
  // minimap at most twice a second.
  update() {
    const axis = this.view.axis;
    if (!axis) return;
    const zoom = this.view.zoom;
    const waits = this.model.roots.flatMap((id) => this.model.waitsOf(id) || []);
    const waited = waits.reduce((sum, [a, b]) => sum + ((b ?? axis.now) - a), 0);
    const key = `${axis.t0}|${axis.t1}|${zoom?.id}|${Math.round(waited / 1000)}`;
    if (key !== this.drawn) {
      this.drawn = key;
      this.ticks.replaceChildren(...ticks(axis.t0, axis.t1, axis.whole0).map(({ at, label }) => {
        const tick = document.createElement("span");
        tick.className = "tick";
        tick.style.left = `${at.toFixed(3)}%`;
        tick.textContent = label;
        return tick;
      }));
      const from = tickLabel(Math.round(axis.t0 - axis.whole0));
      const to = tickLabel(Math.round(axis.t1 - axis.whole0));
      this.label.textContent = zoom
        ? `Zoomed to ${zoom.name ? `${zoom.name}: ` : ""}${from} – ${to} (${duration(axis.t1 - axis.t0)})`
        : `Whole run: ${duration(axis.t1 - axis.t0)}`;
      this.reset.hidden = !zoom;
      this.waiting.hidden = !waits.length;
      this.waiting.textContent = waits.length ? `Waiting for a person: ${duration(waited)}` : "";
    }
    const large = this.model.large || this.model.size >= LARGE_TRACE;
    this.minimap.hidden = !large;
    // Redrawn when the window moves at once; when spans change (live growth)
    // at most once a second; never while only scrolling or opening rows (a
    // search opening its hits' ancestors draws the same map).
    const content = `${this.model.changes}|${this.model.marksVersion}|${this.model.running}`;
    const due = performance.now() - this.mapAt > 1000;
    if (large && (this.mapKey !== key || (this.mapContent !== content && due) || (this.model.running && due))) {
      this.mapAt = performance.now();
      this.mapKey = key;
      this.mapContent = content;
      this.drawMinimap(axis);
    } else if (large && this.mapContent !== content && !this.mapTimer) {
      // Spans changed within the second: drawn when it is over, even if the
      // tree renders nothing more by then (the last page of a load).
      this.mapTimer = setTimeout(() => {
        this.mapTimer = null;
        this.update();
      }, 1000 - (performance.now() - this.mapAt));
    }
  }

  drawMinimap(axis) {
    const canvas = this.minimap;
    const width = canvas.clientWidth || 600;
    const height = canvas.clientHeight || 40;
    const ratio = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
    if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
    const g = canvas.getContext("2d");
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, width, height);
    const { whole0, whole1, now } = axis;
    const range = Math.max(1, whole1 - whole0);
    const x = (t) => Math.max(0, Math.min(width - 1, Math.floor(((t - whole0) / range) * width)));
    // Spans at work per pixel column: a difference array, then a running sum.
    const diff = new Int32Array(width + 1);
    const errors = [];
    for (const node of this.model.nodes.values()) {
      const s = node.s;
      if (node.timesOf !== s) { // parsed once per version of the span
        node.timesOf = s;
        node.t = [Date.parse(s.started_at), s.ended_at ? Date.parse(s.ended_at) : null];
      }
      const [start, end] = node.t;
      diff[x(start)] += 1;
      diff[x(end ?? now) + 1] -= 1;
      if (s.status === "error" || s.status === "abandoned") errors.push(start);
    }
    const density = new Int32Array(width);
    let running = 0;
    let peak = 1;
    for (let i = 0; i < width; i += 1) { running += diff[i]; density[i] = running; peak = Math.max(peak, running); }
    const lane = height - 8;
    g.fillStyle = "#8aa7dc";
    for (let i = 0; i < width; i += 1) {
      if (!density[i]) continue;
      const h = Math.max(1, (Math.log1p(density[i]) / Math.log1p(peak)) * lane);
      g.fillRect(i, lane - h, 1, h);
    }
    g.fillStyle = "#b7791f"; // waiting for a person, along the bottom
    for (const id of this.model.roots) {
      for (const [a, b] of this.model.waitsOf(id) || []) g.fillRect(x(a), height - 6, Math.max(2, x(b ?? now) - x(a)), 5);
    }
    g.fillStyle = "#c92a2a";
    for (const at of errors) g.fillRect(x(at), 0, 2, lane);
    if (this.view.zoom) {
      const a = x(axis.t0);
      const b = Math.max(a + 2, x(axis.t1));
      g.fillStyle = "rgba(255,255,255,.6)";
      g.fillRect(0, 0, a, height);
      g.fillRect(b, 0, width - b, height);
      g.strokeStyle = "#2456c9";
      g.lineWidth = 2;
      g.strokeRect(a + 1, 1, b - a - 2, height - 2);
    }
    canvas.setAttribute("aria-label", `Minimap of the whole run: ${this.model.size} spans over ${duration(range)}`
      + `${errors.length ? `, ${errors.length} failed` : ""}; click or drag to zoom the time axis`);
  }

  timeAt(event) {
    const box = this.minimap.getBoundingClientRect();
    const axis = this.view.axis;
    return axis.whole0 + ((event.clientX - box.left) / box.width) * (axis.whole1 - axis.whole0);
  }

  pickStart(event) {
    this.pickFrom = this.timeAt(event);
    this.pickX = event.clientX;
  }

  pickEnd(event) {
    if (this.pickFrom == null) return;
    const t = this.timeAt(event);
    const axis = this.view.axis;
    if (Math.abs(event.clientX - this.pickX) < 4) {
      // A click: the same window (a tenth of the run when not zoomed) centred there.
      const half = (this.view.zoom ? axis.t1 - axis.t0 : (axis.whole1 - axis.whole0) / 10) / 2;
      this.zoomWindow(t - half, t + half);
    } else {
      this.zoomWindow(this.pickFrom, t);
    }
    this.pickFrom = null;
  }
}
