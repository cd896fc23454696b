// The run's spans as a tree that may be partly loaded: a node's children are
// null until fetched (lazy mode) or known complete (spans seen from their start
// in the event log). Live span events update nodes idempotently by span_id.

const FAILED = new Set(["error", "abandoned"]);

export class TraceModel {
  constructor() {
    this.nodes = new Map(); // span_id -> node
    this.roots = [];
    this.orphans = new Map(); // parent span_id -> [span_id] (parent not seen yet)
    this.version = 0; // bumped on structural change (rows must be re-flattened)
    this.changes = 0; // bumped when a span arrives or changes (not on expand)
    this.t0 = null;
    this.t1 = null;
    this.running = 0;
    // Failed spans (loaded, or named by the server's search with their path):
    // every ancestor of one carries a mark, so an error deep in a large trace
    // shows from the top.
    this.errors = new Map(); // span_id -> ancestor ids (root first)
    this.errorMarks = new Map(); // ancestor span_id -> failed spans below it
  }

  get size() { return this.nodes.size; }

  // Insert or update a span. `complete`: the span is new to the run (seen from
  // its start), so its children are known: none yet. `authoritative`: the data
  // comes from an event (newer than any REST snapshot).
  upsert(span, { complete = false, authoritative = true } = {}) {
    let node = this.nodes.get(span.span_id);
    if (node) {
      // A page of children says which spans are leaves (has_children).
      if (node.children === null && span.has_children === false) node.children = [];
      if (!authoritative && node.fromEvent) return node;
      const wasRunning = node.s.status === "running";
      node.s = span;
      node.fromEvent = node.fromEvent || authoritative;
      if (wasRunning && span.status !== "running") this.running -= 1;
      this.stretch(span);
      if (FAILED.has(span.status)) this.markError(node.id);
      this.changes += 1; // same rows, new content
      return node;
    }
    const leaf = complete || span.has_children === false;
    node = { id: span.span_id, s: span, children: leaf ? [] : null, expanded: false,
      loading: false, next: null, fromEvent: authoritative, parent: span.parent_span_id || "",
      early: [] };
    this.nodes.set(node.id, node);
    if (span.status === "running") this.running += 1;
    this.stretch(span);
    this.attach(node);
    if (FAILED.has(span.status)) this.markError(node.id);
    const waiting = this.orphans.get(node.id);
    if (waiting) {
      this.orphans.delete(node.id);
      this.settle(node);
      for (const id of waiting) this.insertChild(node, this.nodes.get(id));
    }
    this.version += 1;
    this.changes += 1;
    return node;
  }

  attach(node) {
    if (!node.parent) { this.insertSorted(this.roots, node); return; }
    const parent = this.nodes.get(node.parent);
    if (parent) {
      if (parent.children !== null) this.insertChild(parent, node);
      // A lazy parent (its list not known yet): the child is kept, not dropped,
      // and joins the list when it becomes known (its page, or the whole log).
      else if (!parent.early.includes(node.id)) parent.early.push(node.id);
      return;
    }
    const list = this.orphans.get(node.parent) || [];
    list.push(node.id);
    this.orphans.set(node.parent, list);
  }

  // The node's list of children is known from now on: the ones seen before join.
  settle(node) {
    if (node.children === null) node.children = [];
    for (const id of node.early) this.insertChild(node, this.nodes.get(id));
    node.early = [];
  }

  insertChild(parent, node) {
    if (!parent.children.includes(node.id)) this.insertSorted(parent.children, node);
  }

  insertSorted(list, node) {
    const at = node.s.started_at;
    let i = list.length;
    while (i > 0 && this.nodes.get(list[i - 1]).s.started_at > at) i -= 1;
    if (list[i] === node.id || list[i - 1] === node.id) return;
    list.splice(i, 0, node.id);
  }

  // Spans whose parent never appeared (an ingest with a missing parent) show as roots.
  adoptOrphans() {
    for (const [, ids] of this.orphans) for (const id of ids) this.insertSorted(this.roots, this.nodes.get(id));
    this.orphans.clear();
    this.version += 1;
  }

  // A fetched page of children of `parentId` ("" for roots).
  addPage(parentId, spans, next) {
    const parent = parentId ? this.nodes.get(parentId) : null;
    if (parent) this.settle(parent);
    for (const span of spans) this.upsert(span, { authoritative: false });
    if (parent) { parent.next = next; parent.loading = false; }
    else this.rootNext = next;
    this.version += 1;
  }

  stretch(span) {
    const start = Date.parse(span.started_at);
    const end = span.ended_at ? Date.parse(span.ended_at) : null;
    if (this.t0 === null || start < this.t0) this.t0 = start;
    if (end !== null && (this.t1 === null || end > this.t1)) this.t1 = end;
    if (this.t1 === null || start > this.t1) this.t1 = start;
  }

  // A failed span: marks on its ancestors. `path` (from the server) names
  // ancestors that may not be loaded; else the loaded chain is used.
  markError(id, path = null) {
    const ancestors = path || this.pathTo(id).slice(0, -1).map((n) => n.id);
    const known = this.errors.get(id);
    if (known && known.length >= ancestors.length) return;
    if (known) for (const a of known) this.errorMarks.set(a, (this.errorMarks.get(a) || 1) - 1);
    this.errors.set(id, ancestors);
    for (const a of ancestors) this.errorMarks.set(a, (this.errorMarks.get(a) || 0) + 1);
    this.marksVersion = (this.marksVersion || 0) + 1;
  }

  // Time spent waiting for a person (approval spans), per span and every
  // ancestor: [start, end] intervals, end null while it waits.
  waitsOf(id) {
    if (this.waitsVersion !== this.version + this.nodes.size) {
      this.waits = new Map();
      for (const node of this.nodes.values()) {
        if (!node.s.name.startsWith("approval")) continue;
        for (const n of this.pathTo(node.id)) {
          const list = this.waits.get(n.id) || [];
          list.push(node);
          this.waits.set(n.id, list);
        }
      }
      this.waitsVersion = this.version + this.nodes.size;
    }
    // Read at each call: an approval's end arrives without a structural change.
    const nodes = this.waits.get(id);
    return nodes ? nodes.map((n) => [Date.parse(n.s.started_at), n.s.ended_at ? Date.parse(n.s.ended_at) : null]) : null;
  }

  // Every span loaded and every list of children known: the model can answer
  // a search by itself.
  get complete() {
    if (this.rootNext || this.orphans.size) return false;
    for (const node of this.nodes.values()) if (node.children === null || node.next) return false;
    return true;
  }

  // Sorts span ids in the order of their rows once expanded (depth first,
  // siblings by start time).
  treeOrder(ids) {
    const keyOf = (id) => this.pathTo(id).map((n) => [n.s.started_at, n.s.id ?? 0, n.id]);
    const keyed = ids.map((id) => [keyOf(id), id]);
    const cmp = (a, b) => {
      for (let i = 0; i < Math.min(a.length, b.length); i += 1) {
        for (let j = 0; j < 3; j += 1) if (a[i][j] !== b[i][j]) return a[i][j] < b[i][j] ? -1 : 1;
      }
      return a.length - b.length;
    };
    return keyed.sort((x, y) => cmp(x[0], y[0])).map(([, id]) => id);
  }

  // The visible rows: depth-first over expanded nodes, with pseudo-rows for
  // "loading" and "load more".
  flatten() {
    const rows = [];
    const walk = (ids, depth, parent) => {
      for (const id of ids) {
        const node = this.nodes.get(id);
        rows.push({ node, depth, parent });
        if (node.expanded) {
          if (node.children) walk(node.children, depth + 1, node);
          else if (node.early.length) {
            // Spans found by a search or a link before the list is loaded:
            // shown in place, the rest load when their row comes into view.
            walk(this.sortedEarly(node), depth + 1, node);
            if (!node.loading) rows.push({ pseudo: "rest", depth: depth + 1, parent: node });
          }
          if (node.loading) rows.push({ pseudo: "loading", depth: depth + 1, parent: node });
          else if (node.next) rows.push({ pseudo: "more", depth: depth + 1, parent: node });
        }
      }
    };
    walk(this.roots, 0, null);
    if (this.rootNext) rows.push({ pseudo: "more", depth: 0, parent: null });
    return rows;
  }

  sortedEarly(node) {
    return node.early.map((id) => this.nodes.get(id)).sort((a, b) => (a.s.started_at < b.s.started_at ? -1 : 1)).map((n) => n.id);
  }

  pathTo(id) {
    const path = [];
    let node = this.nodes.get(id);
    // Ingested parents may form a cycle: each node at most once.
    while (node && !path.includes(node)) {
      path.unshift(node);
      node = node.parent ? this.nodes.get(node.parent) : null;
    }
    return path;
  }
}
