// Sub-agent runs in the parent's trace. A call that started a child run names
// it (cp.subagent.run_id); the child's spans, from its own run's log, join the
// tree under the call (the child's root's parent is the call's span: one
// trace). While the call is open the page follows the child's own stream
// (`/ws/runs/<child>/`, the same consumer and tenant check as the page's run,
// resumed after the last seq read), so the child's spans show as they happen;
// when the call ends the stream closes and the rest of the child's log is read.
// A child's call that starts a grandchild is followed the same way.
//
// Every event is applied once, in seq order, per child (a cursor): the reads
// and the stream never apply one twice, and the model upserts by span id.

import { api, rowsOf } from "./api.js";
import { Stream } from "./stream.js";
import { firstEvent } from "./trace_loader.js";

const SPAN_EVENTS = new Set(["span.started", "span.ended", "span.abandoned"]);
const PAGE = 1000; // the events endpoint's largest page

export class SubagentRuns {
  // model: the page's TraceModel. hooks: schedule() redraws the tree;
  // flash(message) reports a failure; onRun(id) a child run joined;
  // onEvent(event, node) after a child's event was applied (node: its span's,
  // for a span event); onDelta(frame) a child's model writing (live text,
  // display only).
  constructor({ model, hooks }) {
    Object.assign(this, { model, hooks });
    this.runs = new Map(); // child run id -> ChildRun
  }

  // A span arrived or changed: a sub-agent call's child is followed while the
  // call is open, and read to its end once the call ends.
  see(node) {
    const childId = (node.s.attributes || {})["cp.subagent.run_id"];
    if (!childId) return;
    let child = this.runs.get(childId);
    if (!child) {
      child = new ChildRun(childId, this);
      this.runs.set(childId, child);
      this.hooks.onRun(childId);
    }
    child.callSeen(node);
  }

  // Every child run met so far (grandchildren included).
  get ids() { return [...this.runs.keys()]; }

  // Runs followed live now (read by the tests and handy in the console).
  get following() {
    return [...this.runs.values()].filter((child) => child.stream).map((child) => child.id);
  }
}

class ChildRun {
  constructor(id, owner) {
    Object.assign(this, { id, owner });
    this.cursor = 0; // the last seq of this child's log applied to the model
    this.stream = null;
    this.ended = false; // the call's span ended: nothing more to follow
    this.work = Promise.resolve(); // reads, one after another
  }

  callSeen(call) {
    if (this.ended) return;
    if (call.s.ended_at) {
      this.ended = true;
      this.stopFollowing();
      this.queue(() => this.readRest(call));
    } else if (!this.started) {
      this.started = true;
      this.queue(async () => {
        await this.readRest(call);
        if (!this.ended) this.follow();
      });
    }
  }

  queue(task) {
    this.work = this.work.then(task).catch((error) => {
      this.owner.hooks.flash(`Could not load the sub-agent run ${this.id.slice(0, 8)}: ${error.message}`);
    });
  }

  // Everything in the child's log after the cursor, page by page.
  async readRest(call) {
    for (;;) {
      const data = await api(`/api/v1/runs/${this.id}/events/?after_seq=${this.cursor}&limit=${PAGE}`);
      for (const event of rowsOf(data)) this.apply(event);
      if (data.next_after_seq == null) break;
    }
    call.expanded = true;
    this.owner.model.version += 1;
    this.owner.hooks.schedule();
  }

  follow() {
    const { hooks } = this.owner;
    this.stream = new Stream({
      path: `/ws/runs/${this.id}/`,
      cursorParam: "after_seq",
      cursor: this.cursor,
      cursorOf: (event) => event.seq,
      onEvent: (event) => { this.apply(event); hooks.schedule(); },
      onDelta: (frame) => hooks.onDelta(frame),
      poll: async (after) => rowsOf(await api(`/api/v1/runs/${this.id}/events/?after_seq=${after ?? 0}&limit=500`)),
      onFatal: () => { this.stream = null; hooks.flash(`Stopped following the sub-agent run ${this.id.slice(0, 8)}: its stream was refused.`); },
      quiet: true,
    }).start();
  }

  stopFollowing() {
    if (!this.stream) return;
    this.stream.stop();
    this.stream = null;
  }

  apply(event) {
    if (event.seq <= this.cursor) return; // applied already (read and streamed)
    this.cursor = event.seq;
    if (!SPAN_EVENTS.has(event.type || "")) { this.owner.hooks.onEvent(event, null); return; }
    const known = this.owner.model.nodes.has(event.payload.span_id);
    const node = this.owner.model.upsert(event.payload, { complete: firstEvent(event) });
    // A span new to the page opens, so its children show as they come.
    if (firstEvent(event) && node.children && (!known || node.children.length === 0)) node.expanded = true;
    this.owner.see(node); // a grandchild's call
    this.owner.hooks.onEvent(event, node);
  }
}
