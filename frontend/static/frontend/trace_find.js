// Finding things in a trace: search by span name, attribute value or status
// (hits highlighted, their ancestors opened, n/N next/previous), e for the next
// error (every ancestor of a failed span carries a mark), and deep links
// (#span=<span_id>, #approval=<id>, #call=<tool_call_id>) that select, open and
// scroll to the span. A trace the page holds whole is searched here; a large
// one, whose children load on expand, asks the server
// (GET /api/v1/runs/<id>/spans/search/), which answers with each hit's path.

const FAILED = new Set(["error", "abandoned"]);
// The first matches of a trace not loaded whole: each comes with its spans and
// ancestors, redacted by the server, so a common word asked for its first
// thousand hits took ~0.5 s; the count says how many there are in all.
const SEARCH_PAGE = 200;
// Of those, the first answer: what the screen shows at once (the first hits
// and the ancestors to open) and the count; the rest are asked for once the
// first hit is drawn.
const SEARCH_FIRST = 10;
// ...a moment later, unless the text has changed by then (a search per pause
// while typing) or n/N asks for one of them sooner.
const REST_AFTER_MS = 300;

function valuesOf(value, out = []) {
  if (value && typeof value === "object") for (const v of Object.values(value)) valuesOf(v, out);
  else if (value != null) out.push(String(value));
  return out;
}

// What about the span matches `needle` (lowercase), or null: the same rule as
// the server's (tracing/tree.py span_matches).
export function matchOf(s, needle) {
  if (s.name.toLowerCase().includes(needle)) return "name";
  if (s.status === needle) return `status ${s.status}`;
  if ((s.status_message || "").toLowerCase().includes(needle)) return "status message";
  for (const [key, value] of Object.entries(s.attributes || {})) {
    const hit = valuesOf(value).find((v) => v.toLowerCase().includes(needle));
    if (hit !== undefined) return `${key} = ${hit.length > 60 ? `${hit.slice(0, 60)}…` : hit}`;
  }
  return null;
}

// What a search reads of a span (name, status message, attribute values),
// lowercased once per version of the span: searching a trace the page holds
// whole is then one includes() per span, not a walk of its attributes.
const SEP = "\u0000";
function haystack(node) {
  if (node.hayOf !== node.s) {
    const s = node.s;
    node.hayOf = s;
    node.hay = [s.name, s.status_message || "", ...valuesOf(s.attributes)].join(SEP).toLowerCase();
  }
  return node.hay;
}

// The same rule as matchOf, for a loaded node.
function nodeMatches(node, needle) {
  if (needle.includes(SEP)) return matchOf(node.s, needle) !== null;
  return node.s.status === needle || haystack(node).includes(needle);
}

export class TraceFinder {
  // parts: input, prev, next, nextError, status (elements of the tree's head);
  // hooks: approvals() -> Map of the run's approvals, flash(message).
  constructor({ model, view, loader, parts, hooks }) {
    Object.assign(this, { model, view, loader, hooks, ...parts });
    this.results = [];
    this.index = -1;
    this.token = 0;
    this.serverErrors = false;
    let timer = null;
    this.input.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => this.run(this.input.value), 200);
    });
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") { e.preventDefault(); this.afterSearch(() => this.go(e.shiftKey ? -1 : 1, { focus: false })); }
      else if (e.key === "Escape") { this.input.value = ""; this.run(""); this.view.host.focus(); }
    });
    this.prev.addEventListener("click", () => this.afterSearch(() => this.go(-1)));
    this.next.addEventListener("click", () => this.afterSearch(() => this.go(1)));
    this.nextError.addEventListener("click", () => this.goError());
    // n/N/e and / anywhere on the page but in a field.
    document.addEventListener("keydown", (e) => {
      if (e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey) return;
      if (e.target.closest?.("input, textarea, select, [contenteditable], dialog")) return;
      if (this.key(e)) e.preventDefault();
    });
    window.addEventListener("hashchange", () => this.openLink());
  }

  // The tree's keys (TreeView hooks.onKey) and the page's: true when used.
  key(event) {
    if (event.key === "n") this.afterSearch(() => this.go(1));
    else if (event.key === "N") this.afterSearch(() => this.go(-1));
    else if (event.key === "e") this.goError();
    else if (event.key === "/") this.input.focus();
    else return false;
    return true;
  }

  // Enter right after typing: the search the text asks for, then the move.
  async afterSearch(then) {
    if (this.input.value.trim().toLowerCase() !== (this.needle || "")) await this.run(this.input.value, { select: false });
    if (this.pending) await this.pending;
    then();
  }

  async run(text, { select = true } = {}) {
    const needle = text.trim().toLowerCase();
    const token = ++this.token;
    this.needle = needle;
    if (!needle) {
      this.results = [];
      this.index = -1;
      this.view.hits = null;
      this.say("");
      this.view.schedule();
      return;
    }
    const began = performance.now();
    this.rest = null;
    let ids;
    let count;
    let sent = 0; // matches the first answer brought
    let more = 0; // matches past them, still to ask for
    const work = (async () => {
      if (this.model.complete) {
        ids = [];
        for (const node of this.model.nodes.values()) if (nodeMatches(node, needle)) ids.push(node.id);
        ids = this.model.treeOrder(ids);
        count = ids.length;
      } else {
        this.say("Searching the whole trace…");
        let found;
        try { found = await this.loader.search({ q: text.trim(), limit: SEARCH_FIRST }, { urgent: true }); } catch (error) {
          if (token === this.token) this.say(`Search failed: ${error.message}`);
          return false;
        }
        if (token !== this.token) return false;
        this.loader.adopt(found);
        ids = found.matches.map((m) => m.span_id).filter((id) => this.model.nodes.has(id));
        count = found.count;
        sent = found.matches.length;
        if (found.truncated) more = Math.max(0, Math.min(count, SEARCH_PAGE) - found.matches.length);
      }
      return true;
    })();
    this.pending = work;
    if (!(await work) || token !== this.token) return;
    this.pending = null;
    this.results = [];
    this.index = -1;
    this.view.hits = { ids: new Map(), current: null, needle };
    this.open(ids);
    window.cpSearchMs = performance.now() - began; // read by bench/bench_ui.py
    if (!ids.length) { this.say(`No span matches “${text.trim()}”`); this.view.schedule(); return; }
    this.total = count;
    // The hits this search will hold once the rest has come (n/N go round them).
    this.expected = ids.length + more;
    if (more) this.rest = this.askRest(token, text.trim(), sent, more);
    if (select) this.go(1, { focus: false });
    else { this.sayPosition(); this.view.schedule(); }
  }

  // Hits join the results, marked, with their ancestors open (a parent whose
  // list is not loaded shows the hits it holds, and loads the rest when that
  // row comes into view).
  open(ids) {
    const { needle } = this.view.hits;
    for (const id of ids) {
      this.view.hits.ids.set(id, matchOf(this.model.nodes.get(id).s, needle) || "match");
      for (const node of this.model.pathTo(id).slice(0, -1)) node.expanded = true;
    }
    this.results.push(...ids);
    this.model.version += 1;
    this.view.userChange = true;
  }

  // The matches after the first answer, up to SEARCH_PAGE in all.
  async askRest(token, q, offset, limit) {
    await new Promise((resolve) => {
      this.restNow = resolve;
      setTimeout(resolve, REST_AFTER_MS);
    });
    if (token !== this.token) return;
    try {
      const found = await this.loader.search({ q, offset, limit });
      if (token !== this.token) return;
      this.loader.adopt(found);
      this.open(found.matches.map((m) => m.span_id).filter((id) => this.model.nodes.has(id)));
    } catch { /* n/N go round the hits the first answer brought */ }
    if (token !== this.token) return;
    this.rest = null;
    this.expected = this.results.length;
    this.sayPosition();
    this.view.schedule();
  }

  sayPosition() {
    const n = this.expected;
    const shown = this.total > n ? `${n} shown of ${this.total}` : `${n}`;
    this.say(this.index < 0 ? `${shown} match${n === 1 ? "" : "es"}` : `${this.index + 1} of ${shown} match${n === 1 ? "" : "es"}`);
  }

  async go(delta, { focus = true } = {}) {
    const n = this.expected;
    if (!this.results.length) return;
    const index = this.index < 0 ? (delta > 0 ? 0 : n - 1) : (this.index + delta + n) % n;
    if (index >= this.results.length) {
      // A hit of the rest, still on its way (or lost: then round what came).
      const token = this.token;
      this.restNow?.();
      await this.rest;
      if (token === this.token) this.go(delta, { focus });
      return;
    }
    this.index = index;
    const id = this.results[this.index];
    this.view.hits.current = id;
    this.reveal(id, { focus });
    this.sayPosition();
  }

  // Errors in the whole trace: the server names them once for a large trace
  // (with their paths, so their ancestors are marked); live ones come with
  // their span's event.
  async loadErrors() {
    if (this.model.complete || this.serverErrors) return;
    try {
      const found = await this.loader.search({ status: "error" });
      this.loader.adopt(found);
      for (const m of found.matches) this.model.markError(m.span_id, m.path);
      this.serverErrors = true;
      this.view.schedule();
    } catch { /* marks from loaded spans only */ }
  }

  goError() {
    const errors = this.model.treeOrder([...this.model.errors.keys()].filter((id) => FAILED.has(this.model.nodes.get(id)?.s.status)));
    if (!errors.length) { this.say("No errors in this trace"); return; }
    const at = errors.indexOf(this.view.selectedId);
    const id = errors[(at + 1) % errors.length];
    this.reveal(id, { focus: true });
    this.say(`Error ${errors.indexOf(id) + 1} of ${errors.length}: ${this.model.nodes.get(id).s.name}`);
  }

  say(text) {
    this.status.textContent = text;
  }

  reveal(id, { focus = true } = {}) {
    this.view.select(id, { focus });
    this.view.center(id);
    this.view.schedule();
    // Once drawn, the row on screen too (the page may scroll, not only the tree),
    // away from its edges: what appears above the tree once the trace has loaded
    // (the minimap of a large trace) then pushes it down without taking it off screen.
    requestAnimationFrame(() => requestAnimationFrame(() => {
      // Unless a later move selected another span first (n pressed again on a
      // busy page): this row, still drawn, would pull the tree back from it.
      if (this.view.selectedId !== id) return;
      const row = document.getElementById(`row-${id}`);
      if (!row) return;
      const { top, bottom } = row.getBoundingClientRect();
      const margin = window.innerHeight / 5;
      if (top < margin || bottom > window.innerHeight - margin) {
        row.scrollIntoView({ block: "center" });
      }
    }));
  }

  // ---- deep links -----------------------------------------------------------

  // The selected span in the address bar (replacing, not adding, history).
  remember(node) {
    if (this.opening) return;
    const hash = `#span=${node.id}`;
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }

  async openLink() {
    const hash = new URLSearchParams(location.hash.slice(1));
    let id = hash.get("span");
    let call = hash.get("call");
    const approvalId = hash.get("approval");
    if (!id && !call && !approvalId) return;
    this.opening = true;
    try {
      if (approvalId) {
        const approval = this.hooks.approvals().get(approvalId);
        if (!approval) { this.hooks.flash("The linked approval is not one of this run's."); return; }
        call = approval.tool_call_id;
      }
      if (call) id = await this.approvalSpan(call);
      if (id && /^[0-9a-f]{16}$/i.test(id)) id = id.toLowerCase();
      if (id && !this.model.nodes.has(id) && !this.model.complete) {
        const found = await this.loader.search({ span_id: id });
        this.loader.adopt(found);
      }
      if (!id || !this.model.nodes.has(id)) {
        this.hooks.flash("The linked span is not in this run's trace.");
        return;
      }
      this.reveal(id, { focus: true });
    } catch (error) {
      this.hooks.flash(`Could not open the linked span: ${error.message}`);
    } finally {
      this.opening = false;
    }
  }

  async approvalSpan(call) {
    const isIt = (node) => node.s.name.startsWith("approval") && (node.s.attributes || {})["gen_ai.tool.call.id"] === call;
    for (const node of this.model.nodes.values()) if (isIt(node)) return node.id;
    if (this.model.complete) return null;
    const found = await this.loader.search({ q: call });
    this.loader.adopt(found);
    for (const m of found.matches) {
      const node = this.model.nodes.get(m.span_id);
      if (node && isIt(node)) return node.id;
    }
    return null;
  }
}
