// A virtualised tree: only the rows in view (plus a margin) are in the DOM, at
// fixed height, absolutely positioned over a spacer as tall as all rows.
// Keyboard: ↑/↓ move, → expands or enters, ← collapses or goes up, Home/End,
// PageUp/PageDown, * expands all siblings; the focused row is the selected span.
// Other keys go to hooks.onKey (search: n/N/e, zoom: z). The timeline column
// is drawn on `axis` (the whole trace, or the span zoomed to); a search's hits
// are highlighted and every ancestor of a failed span carries a mark.

import { decisionSummary, duration, money, statusParts, timeLeft, tokens } from "./format.js";

export const ROW_HEIGHT = 30;
const OVERSCAN = 12;

const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

export class TreeView {
  // host: the scrolling element (role=tree); model: TraceModel;
  // hooks: loadChildren(node), loadMore(parentNode|null), onSelect(node),
  // approvalFor(node) -> pending approval or null, decisionFor(node) -> the decision
  // on a decided approval node or null, costOf(node), decide(approval, verb)
  constructor(host, model, hooks) {
    Object.assign(this, { host, model, hooks });
    this.rows = [];
    this.flatVersion = -1;
    this.active = -1;
    this.selectedId = null;
    this.frame = 0;
    this.canDecide = hooks.canDecide;
    this.zoom = null; // {t0, t1, id}: the timeline shows this window only
    this.hits = null; // {ids: Map span_id -> what matched, current, needle}
    this.spacer = document.createElement("div");
    this.spacer.className = "tree-spacer";
    this.layer = document.createElement("div");
    this.layer.className = "tree-rows";
    this.spacer.append(this.layer);
    this.mounted = new Map(); // row key -> {html, el} of the rows in the DOM
    this.template = document.createElement("template");
    host.append(this.spacer);
    host.addEventListener("scroll", () => this.schedule(), { passive: true });
    host.addEventListener("keydown", (e) => this.onKey(e));
    host.addEventListener("click", (e) => this.onClick(e));
    new ResizeObserver(() => this.schedule()).observe(host);
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => { this.frame = 0; this.render(); });
  }

  // Live appends re-flatten a big tree at most every 250 ms (a user's own
  // expand/collapse is immediate): the rows in view stay cheap to draw.
  refreshRows({ force = false } = {}) {
    if (this.flatVersion === this.model.version) return;
    const big = this.rows.length > 5000;
    const since = performance.now() - (this.flatAt || 0);
    if (big && !force && !this.userChange && since < 250) {
      clearTimeout(this.flatTimer);
      this.flatTimer = setTimeout(() => this.schedule(), 250 - since);
      return;
    }
    this.userChange = false;
    this.flatAt = performance.now();
    const activeId = this.rows[this.active]?.node?.id;
    this.rows = this.model.flatten();
    this.flatVersion = this.model.version;
    // As tall as the rows at once: a scroll to a row set before the next
    // frame (a deep link, a search hit) must not be clamped to the old height.
    this.spacer.style.height = `${this.rows.length * ROW_HEIGHT}px`;
    if (activeId) {
      const was = this.active;
      this.active = this.rows.findIndex((r) => r.node && r.node.id === activeId);
      // Rows that load above the selected one (the other spans of the steps a
      // search opened) leave it where it is on screen, as a browser anchors
      // scrolling: it had been centred, and they pushed it out of view.
      const top = this.host.scrollTop;
      const inView = was * ROW_HEIGHT >= top && (was + 1) * ROW_HEIGHT <= top + this.host.clientHeight;
      if (this.active >= 0 && this.active !== was && inView) this.host.scrollTop = top + (this.active - was) * ROW_HEIGHT;
    }
  }

  render() {
    const began = performance.now();
    this.refreshRows();
    const total = this.rows.length;
    this.spacer.style.height = `${total * ROW_HEIGHT}px`;
    const top = this.host.scrollTop;
    const height = this.host.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / ROW_HEIGHT) - OVERSCAN);
    const last = Math.min(total, Math.ceil((top + height) / ROW_HEIGHT) + OVERSCAN);
    // While spans run the axis ends at "now", moved once a second so that rows
    // whose content did not change keep their DOM.
    const now = this.model.running ? Math.ceil(Date.now() / 1000) * 1000 : Date.now();
    const whole0 = this.model.t0 ?? now;
    const whole1 = Math.max(this.model.running ? now : (this.model.t1 ?? now), whole0 + 1);
    const t0 = this.zoom ? this.zoom.t0 : whole0;
    const t1 = this.zoom ? Math.max(this.zoom.t1, t0 + 1) : whole1;
    this.axis = { t0, t1, whole0, whole1, now };
    const keep = new Map();
    const order = [];
    for (let i = first; i < last; i += 1) {
      const row = this.rows[i];
      const key = row.node ? row.node.id : `${row.pseudo}:${row.parent?.id ?? ""}`;
      const html = this.rowHtml(row, i, t0, t1, now);
      let item = this.mounted.get(key);
      if (!item || item.html !== html) {
        this.template.innerHTML = html;
        item = { html, el: this.template.content.firstElementChild };
      }
      keep.set(key, item);
      order.push(item.el);
    }
    for (const [key, item] of this.mounted) if (keep.get(key) !== item) item.el.remove();
    this.mounted = keep;
    // DOM order follows the rows (screen readers read it), appending only what moved.
    let cursor = this.layer.firstElementChild;
    for (const el of order) {
      if (el === cursor) cursor = cursor.nextElementSibling;
      else this.layer.insertBefore(el, cursor);
    }
    if (this.active >= 0 && this.rows[this.active]?.node) this.host.setAttribute("aria-activedescendant", `row-${this.rows[this.active].node.id}`);
    else this.host.removeAttribute("aria-activedescendant");
    // A "load more" row in view pages on by itself.
    for (let i = first; i < last; i += 1) {
      const row = this.rows[i];
      if (row.pseudo === "more" && !(row.parent?.loading ?? this.model.rootLoading)) this.hooks.loadMore(row.parent);
      if (row.pseudo === "rest" && !row.parent.loading) {
        row.parent.loading = true;
        this.hooks.loadChildren(row.parent);
      }
    }
    if (this.hooks.afterRender) this.hooks.afterRender(last - first);
    if (window.cpRenderTimes) window.cpRenderTimes.push(performance.now() - began);
  }

  rowHtml(row, index, t0, t1, now) {
    const top = index * ROW_HEIGHT;
    const pad = 8 + row.depth * 16;
    if (row.pseudo) {
      const text = { loading: "Loading…", more: "Loading more…", rest: "Loading the other spans here…" }[row.pseudo];
      return `<div class="trow pseudo" role="none" style="top:${top}px"><span style="padding-left:${pad + 18}px" class="muted">${text}</span></div>`;
    }
    const node = row.node;
    const s = node.s;
    const a = s.attributes || {};
    const approval = this.hooks.approvalFor(node);
    const decision = approval ? null : this.hooks.decisionFor?.(node);
    // A decided approval reads as its decision, a finished root as its run's
    // status (an unverified run is not "done"), whatever the span's own code.
    let shown = s.status;
    if (decision) shown = decision.status;
    else if (a["gen_ai.operation.name"] === "invoke_agent" && s.ended_at && a["cp.run.status"]) shown = a["cp.run.status"];
    const [icon, word] = statusParts(shown);
    const start = Date.parse(s.started_at);
    const end = s.ended_at ? Date.parse(s.ended_at) : now;
    const span = t1 - t0;
    // Clipped to a window around the axis (a zoomed axis leaves most outside).
    const cs = Math.max(start, t0 - span);
    const ce = Math.max(cs, Math.min(end, t1 + span));
    const clippedLeft = ((cs - t0) / span) * 100;
    const width = Math.max(0.3, ((ce - cs) / span) * 100);
    const waits = this.model.waitsOf(node.id);
    let waitBars = "";
    for (const [ws, we] of waits || []) {
      const wend = we ?? now;
      if (wend < t0 || ws > t1) continue;
      const wl = ((Math.max(ws, t0) - t0) / span) * 100;
      const ww = Math.max(0.3, ((Math.min(wend, t1) - Math.max(ws, t0)) / span) * 100);
      waitBars += `<span class="wait" title="waiting for a person: ${esc(duration(wend - ws))}" style="left:${wl.toFixed(3)}%;width:${ww.toFixed(3)}%"></span>`;
    }
    const hit = this.hits?.ids.get(node.id);
    const current = this.hits?.current === node.id;
    const errorsBelow = this.model.errorMarks.get(node.id) || 0;
    const inT = a["gen_ai.usage.input_tokens"];
    const outT = a["gen_ai.usage.output_tokens"];
    const tok = inT != null || outT != null ? tokens((inT || 0) + (outT || 0)) : "";
    const tokTitle = inT != null || outT != null ? `${inT || 0} in / ${outT || 0} out` : "";
    const cost = this.hooks.costOf(node);
    const leaf = node.children !== null && node.children.length === 0 && !node.next;
    const toggle = leaf ? `<span class="toggle leaf" aria-hidden="true"></span>`
      : `<span class="toggle" data-action="toggle" aria-hidden="true">${node.expanded ? "▾" : "▸"}</span>`;
    const selected = node.id === this.selectedId;
    const focus = index === this.active;
    let extra = "";
    if (approval) {
      const args = JSON.stringify(approval.args ?? {});
      extra = `<span class="approval-inline"><span class="args" title="${esc(args)}">${esc(args.slice(0, 120))}</span>`
        + `<span class="rule" title="the rule that asked: ${esc(approval.rule_reason || approval.rule || "")}">rule: ${esc(approval.rule_reason || approval.rule || "")}</span>`
        + `<span class="left" data-expires="${esc(approval.expires_at)}">${esc(timeLeft(approval.expires_at))}</span>`
        + (this.canDecide ? `<button type="button" class="approve" data-action="approve" data-approval="${esc(approval.id)}" aria-label="Approve ${esc(approval.tool)}">✓ Approve</button>`
          + `<button type="button" class="deny" data-action="deny" data-approval="${esc(approval.id)}" aria-label="Deny ${esc(approval.tool)}">✕ Deny</button>` : "")
        + `</span>`;
    }
    if (decision) {
      const text = decisionSummary(decision);
      extra = `<span class="decision-inline" data-testid="decision-inline" title="${esc(text)}">${esc(text)}</span>`;
    }
    // No aria-label: the row's name is its content ("<name>, <status>[, errors
    // below]," in the label, then what else the row shows), so what a person sees
    // is part of what a screen reader says (axe's label-content-name-mismatch).
    const label = `${s.name}, ${approval ? "waiting for approval" : word}${errorsBelow ? `, ${errorsBelow === 1 ? "an error" : `${errorsBelow} errors`} below` : ""}`;
    let name = esc(s.name);
    if (hit && this.hits.needle) {
      const at = s.name.toLowerCase().indexOf(this.hits.needle);
      if (at >= 0) name = `${esc(s.name.slice(0, at))}<mark>${esc(s.name.slice(at, at + this.hits.needle.length))}</mark>${esc(s.name.slice(at + this.hits.needle.length))}`;
    }
    const why = hit && hit !== "name" ? `<span class="hit-why" title="${esc(hit)}">${esc(hit)}</span>` : "";
    const below = errorsBelow ? `<span class="err-below" title="${esc(`${errorsBelow} failed span${errorsBelow === 1 ? "" : "s"} below; press e to go to the next error`)}" aria-hidden="true">▲${errorsBelow}</span>` : "";
    return `<div class="trow st-${esc(s.status)}${selected ? " selected" : ""}${focus ? " focus" : ""}${approval ? " pending" : ""}${hit ? " hit" : ""}${current ? " hit-current" : ""}${errorsBelow ? " has-error-below" : ""}" id="row-${esc(node.id)}" role="treeitem"`
      + ` aria-level="${row.depth + 1}" aria-selected="${selected}"${leaf ? "" : ` aria-expanded="${node.expanded}"`}`
      + ` data-index="${index}" data-span="${esc(node.id)}" style="top:${top}px">`
      + `<span class="name" style="padding-left:${pad}px">${toggle}<span class="sicon s-${esc(approval ? "waiting_approval" : shown)}" title="${esc(approval ? "waiting for approval" : word)}" aria-hidden="true">${approval ? "‖" : icon}</span>`
      + `<span class="label" title="${esc(s.name)}">${name}<span class="sr-only">, ${esc(label.slice(s.name.length + 2))},</span></span>${below}${why}${extra}</span>`
      + (approval ? "" : `<span class="num" title="${esc(tokTitle)}">${tok}</span><span class="num">${cost == null ? "" : money(cost)}</span>`
      + `<span class="num">${duration(end - start)}</span>`)
      + (approval ? "" : `<span class="bar-track" data-action="zoom" title="click to zoom the time axis to ${esc(s.name)}"><span class="bar b-${esc(s.name.startsWith("approval") ? "wait" : s.status)}" style="left:${clippedLeft.toFixed(3)}%;width:${width.toFixed(3)}%"></span>${waitBars}</span>`)
      + `</div>`;
  }

  onClick(event) {
    const target = event.target.closest("[data-action], .trow");
    if (!target) return;
    const rowEl = event.target.closest(".trow");
    const index = rowEl ? Number(rowEl.dataset.index) : -1;
    const action = target.dataset.action;
    if (action === "approve" || action === "deny") {
      event.stopPropagation();
      this.hooks.decide(target.dataset.approval, action, target);
      return;
    }
    if (index < 0 || Number.isNaN(index)) return;
    if (action === "toggle") this.toggle(this.rows[index].node);
    this.moveTo(index, { focus: true });
    if (action === "zoom") this.hooks.onZoom?.(this.rows[index].node);
  }

  async toggle(node, open = !node.expanded) {
    if (!node) return;
    node.expanded = open;
    this.userChange = true;
    this.model.version += 1;
    if (open && node.children === null && !node.loading) {
      node.loading = true;
      this.schedule();
      await this.hooks.loadChildren(node);
    }
    this.schedule();
  }

  moveTo(index, { focus = false } = {}) {
    this.refreshRows({ force: true });
    if (index < 0 || index >= this.rows.length) return;
    while (index < this.rows.length && !this.rows[index].node) index -= 1;
    if (index < 0) return;
    this.active = index;
    const node = this.rows[index].node;
    this.selectedId = node.id;
    this.scrollIntoView(index);
    if (focus) this.host.focus({ preventScroll: true });
    this.hooks.onSelect(node);
    this.schedule();
  }

  // A deep link or a search hit: the row in the middle of the view.
  center(id) {
    const index = this.rows.findIndex((r) => r.node && r.node.id === id);
    if (index < 0) return;
    this.host.scrollTop = Math.max(0, index * ROW_HEIGHT - this.host.clientHeight / 2);
  }

  scrollIntoView(index) {
    const top = index * ROW_HEIGHT;
    const h = this.host.clientHeight;
    if (top < this.host.scrollTop) this.host.scrollTop = top;
    else if (top + ROW_HEIGHT > this.host.scrollTop + h) this.host.scrollTop = top + ROW_HEIGHT - h;
  }

  select(id, { focus = true } = {}) {
    const path = this.model.pathTo(id);
    for (const node of path.slice(0, -1)) node.expanded = true;
    this.model.version += 1;
    this.refreshRows({ force: true });
    const index = this.rows.findIndex((r) => r.node && r.node.id === id);
    if (index >= 0) this.moveTo(index, { focus });
  }

  onKey(event) {
    if (event.target !== this.host) return;
    this.refreshRows({ force: true });
    const row = this.rows[this.active];
    const node = row?.node;
    const page = Math.max(1, Math.floor(this.host.clientHeight / ROW_HEIGHT) - 1);
    switch (event.key) {
      case "ArrowDown": this.moveTo(Math.min(this.rows.length - 1, this.active + 1)); break;
      case "ArrowUp": this.moveTo(Math.max(0, this.active - 1)); break;
      case "Home": this.moveTo(0); break;
      case "End": this.moveTo(this.rows.length - 1); break;
      case "PageDown": this.moveTo(Math.min(this.rows.length - 1, this.active + page)); break;
      case "PageUp": this.moveTo(Math.max(0, this.active - page)); break;
      case "ArrowRight":
        if (!node) break;
        if (!node.expanded && !(node.children && node.children.length === 0 && !node.next)) this.toggle(node, true);
        else if (node.expanded) this.moveTo(this.active + 1);
        break;
      case "ArrowLeft":
        if (!node) break;
        if (node.expanded) this.toggle(node, false);
        else if (row.parent) this.moveTo(this.rows.findIndex((r) => r.node === row.parent));
        break;
      case "*": // expand every sibling of the focused node (WAI-ARIA tree)
        if (!node) break;
        for (const sibling of this.rows.filter((r) => r.node && r.parent === row.parent)) {
          // (one opened by a search shows only its hits until loaded)
          if (!sibling.node.expanded || sibling.node.children === null) this.toggle(sibling.node, true);
        }
        break;
      case "Enter": case " ":
        if (node) this.toggle(node);
        break;
      default:
        if (!this.hooks.onKey?.(event, node)) return;
    }
    event.preventDefault();
  }
}
