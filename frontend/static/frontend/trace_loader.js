// Loading a run's trace into the TraceModel: a small run whole from its event
// log, a large one by pages of children (roots first, the rest on expand), and
// spans found by a search or a deep link, with their ancestors, in place.

import { api, ApiError, rowsOf } from "./api.js";

const EAGER_EVENTS = 1000; // a run with fewer events loads whole from its log
const EVENT_PAGE = 1000; // the events endpoint's largest page
const SPAN_PAGE = 500;
// Pages of children loading at once. A search that opened 200 steps set the
// ten in view loading together: they took the browser's six connections to the
// server and its cores, and the next search waited ~400 ms behind them.
const PAGE_LANES = 2;
// ...and start this long after a search's answer: the person may be typing
// the next (a search per pause), and what this one opened need not load yet.
const SETTLE_MS = 250;

// A span seen from its first event on: its children's events all come with or
// after it, so its list of children is known (not loaded on demand).
export function firstEvent(event) {
  return event.type === "span.started" || event.payload.first_event === true;
}

export class TraceLoader {
  // hooks: schedule() redraws the tree, flash(message) reports a failure.
  constructor({ runId, model, perf, hooks }) {
    Object.assign(this, { runId, model, perf, hooks });
    this.cursor = 0; // the last event seq the model holds
    this.lanes = 0; // pages of children loading
    this.waiting = []; // resolvers of pages waiting for a lane
    this.urgent = null; // a search the person waits for: pages start after it
    this.answeredAt = -Infinity; // when the last such search was answered
  }

  // Resolves once no search the person waits for is being asked, SETTLE_MS
  // after the last one's answer.
  async quiet() {
    for (;;) {
      if (this.urgent) { await this.urgent.catch(() => {}); continue; }
      const wait = this.answeredAt + SETTLE_MS - performance.now();
      if (wait <= 0) return;
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
  }

  // Runs `task` (a page of children) in a free lane, once no search is waiting.
  async inLane(task) {
    for (;;) {
      await this.quiet();
      if (this.lanes < PAGE_LANES) break;
      await new Promise((resolve) => this.waiting.push(resolve));
    }
    this.lanes += 1;
    try {
      return await task();
    } finally {
      this.lanes -= 1;
      this.waiting.shift()?.();
    }
  }

  async fetchSpans(url) {
    const page = await api(url);
    let next = null;
    if (page && !Array.isArray(page)) {
      if (page.next) next = page.next;
      else if (page.next_offset != null) {
        const u = new URL(url, location.origin);
        u.searchParams.set("offset", String(page.next_offset));
        next = u.pathname + u.search;
      }
    }
    return { spans: rowsOf(page), next };
  }

  childrenUrl(parentId) {
    return `/api/v1/runs/${this.runId}/spans/?parent=${parentId}&limit=${SPAN_PAGE}`;
  }

  async loadChildren(node) {
    try {
      const { spans, next } = await this.inLane(() => this.fetchSpans(this.childrenUrl(node.id)));
      this.model.addPage(node.id, spans, next);
    } catch (error) {
      node.loading = false;
      node.expanded = false;
      this.hooks.flash(`Could not load children of ${node.s.name}: ${error.message}`);
    }
    this.model.version += 1;
    this.hooks.schedule();
  }

  async loadMore(parent) {
    const model = this.model;
    const next = parent ? parent.next : model.rootNext;
    if (!next || (parent ? parent.loading : model.rootLoading)) return;
    if (parent) parent.loading = true; else model.rootLoading = true;
    try {
      const { spans, next: after } = await this.inLane(() => this.fetchSpans(next));
      model.addPage(parent ? parent.id : "", spans, after);
      if (!parent) model.rootNext = after;
    } catch (error) {
      this.hooks.flash(`Could not load more spans: ${error.message}`);
    } finally {
      if (parent) parent.loading = false; else model.rootLoading = false;
      model.version += 1;
      this.hooks.schedule();
    }
  }

  // Spans the server found (a search's matches, a linked span) with every
  // ancestor, parents first: each joins its parent's list in place (a parent
  // whose list is not loaded yet shows them, and loads the rest on view).
  adopt(result) {
    const depth = new Map();
    for (const match of result.matches || []) {
      match.path.forEach((id, i) => depth.set(id, Math.min(depth.get(id) ?? i, i)));
      depth.set(match.span_id, Math.min(depth.get(match.span_id) ?? match.path.length, match.path.length));
    }
    const spans = [...(result.spans || [])].sort((a, b) => (depth.get(a.span_id) ?? 0) - (depth.get(b.span_id) ?? 0));
    for (const span of spans) this.model.upsert(span, { authoritative: false });
  }

  // urgent: the person waits for this answer (pages of children wait for it).
  async search(params, { urgent = false } = {}) {
    const query = new URLSearchParams(params);
    const asked = api(`/api/v1/runs/${this.runId}/spans/search/?${query}`);
    if (!urgent) return asked;
    this.urgent = asked;
    try {
      return await asked;
    } finally {
      if (this.urgent === asked) this.urgent = null;
      this.answeredAt = performance.now();
    }
  }

  // The log's last seq without reading it all: gallop, then bisect.
  async lastSeq(known) {
    // Each probe after a search being asked: a dozen of them follow the page's
    // first rows, when a person may already be searching.
    const has = async (after) => {
      await this.quiet();
      return rowsOf(await api(`/api/v1/runs/${this.runId}/events/?after_seq=${after}&limit=1`)).length > 0;
    };
    if (!(await has(known))) return known;
    let low = known; // invariant: an event after low exists, none after high
    let high = known * 4 + 1000;
    while (await has(high)) { low = high; high *= 4; }
    while (high - low > 1) {
      const mid = Math.floor((low + high) / 2);
      if (await has(mid)) low = mid; else high = mid;
    }
    return high;
  }

  applyEventQuiet(event) {
    if (event.type === "span.started" || event.type === "span.ended" || event.type === "span.abandoned") {
      this.model.upsert(event.payload, { complete: firstEvent(event) });
    }
  }

  expandDefault() {
    // Expand everything in a small trace; a large one opens root and steps only.
    const all = this.model.size <= 400;
    for (const node of this.model.nodes.values()) {
      const depth = this.model.pathTo(node.id).length;
      node.expanded = all || depth <= 2;
    }
    this.model.version += 1;
  }

  // Returns null (the whole run is loaded) or a function that finds the
  // stream's cursor and reads the loaded pages again (see docs/ui.md).
  async load() {
    const { model, perf, runId } = this;
    const events = [];
    let page = null;
    let available = true;
    try {
      // One tiny probe decides: a log longer than a page means a large run,
      // which never downloads its log.
      const probe = await api(`/api/v1/runs/${runId}/events/?after_seq=${EAGER_EVENTS}&limit=1`);
      perf.probed = performance.now();
      if (rowsOf(probe).length) {
        page = { events: new Array(EVENT_PAGE) }; // "full": take the lazy path
      } else {
        page = await api(`/api/v1/runs/${runId}/events/?after_seq=0&limit=${EVENT_PAGE}`);
        events.push(...rowsOf(page));
      }
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 404)) throw error;
      available = false; // no events endpoint: the socket replays from the start
    }
    const complete = !available || rowsOf(page).length < EVENT_PAGE;
    if (complete) {
      // A small run: its log is the whole story, every node fully known.
      for (const event of events) { this.cursor = event.seq; this.applyEventQuiet(event); }
      for (const node of model.nodes.values()) model.settle(node);
      model.adoptOrphans();
      this.expandDefault();
      return null;
    }
    // A large run: roots and the first pages of children now, the rest on expand.
    model.large = true;
    const roots = await this.fetchSpans(this.childrenUrl(""));
    model.addPage("", roots.spans, roots.next);
    model.rootNext = roots.next;
    perf.roots = performance.now();
    this.hooks.schedule();
    const opened = model.roots.slice(0, 3).map((id) => model.nodes.get(id));
    await Promise.all(opened.map((node) => {
      node.expanded = true;
      node.loading = true;
      return this.loadChildren(node);
    }));
    // Then the stream's cursor: the log's last seq, and the loaded pages read
    // again after it, so no change falls between the snapshot and the stream
    // (events after the cursor are replayed and applied idempotently).
    return async () => {
      this.cursor = await this.lastSeq(EAGER_EVENTS);
      perf.cursor = performance.now();
      const again = await this.fetchSpans(this.childrenUrl(""));
      model.addPage("", again.spans, model.rootNext);
      await Promise.all(opened.map(async (node) => {
        const page = await this.fetchSpans(this.childrenUrl(node.id));
        model.addPage(node.id, page.spans, node.next);
      }));
      this.hooks.schedule();
    };
  }
}
