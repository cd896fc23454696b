// Follow a WebSocket stream with resume by cursor (seq for a run, id for the
// tenant): after any disconnect the page asks for everything after the last
// event it holds, so it has every event exactly once. While the socket cannot
// connect, the page says so ("reconnecting") and polls instead.

import { showConnection } from "./format.js";

const BACKOFF_MS = [500, 1000, 2000, 4000, 8000];

export class Stream {
  // path: "/ws/runs/<id>/"; cursorParam: "after_seq" | "after_id";
  // cursor: the last seq/id the page holds (null: live only);
  // onEvent(event); onResync(): refetch after (re)connect when no cursor;
  // poll(cursor) -> events after cursor (null: nothing to poll);
  // heartbeatSeconds: watchdog for a silently dead socket.
  constructor({ path, cursorParam, cursor = null, cursorOf, onEvent, onResync, poll, onFatal, heartbeatSeconds = 20 }) {
    Object.assign(this, { path, cursorParam, cursor, cursorOf, onEvent, onResync, poll, onFatal });
    this.failures = 0;
    this.state = "connecting";
    this.watchdogMs = heartbeatSeconds * 2500;
    this.stopped = false;
    this.pollTimer = null;
    this.reconnectTimer = null;
    window.cpStreams = window.cpStreams || [];
    window.cpStreams.push(this);
  }

  start() { this.connect(); return this; }

  stop() {
    this.stopped = true;
    clearTimeout(this.reconnectTimer);
    clearTimeout(this.watchdog);
    this.stopPolling();
    if (this.ws) this.ws.close();
  }

  setState(state) {
    this.state = state;
    document.body.dataset.stream = state;
    showConnection(state);
  }

  url() {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const query = this.cursor == null ? "" : `?${this.cursorParam}=${this.cursor}`;
    return `${proto}//${location.host}${this.path}${query}`;
  }

  connect() {
    if (this.stopped) return;
    if (this.state !== "polling") this.setState(this.failures ? "reconnecting" : "connecting");
    let ws;
    try { ws = new WebSocket(this.url()); } catch { this.scheduleReconnect(); return; }
    this.ws = ws;
    ws.onopen = () => {
      this.failures = 0;
      this.stopPolling();
      this.setState("live");
      this.kick();
      if (this.cursor == null && this.onResync) this.onResync();
    };
    ws.onmessage = (message) => {
      this.kick();
      let frame;
      try { frame = JSON.parse(message.data); } catch { return; }
      if (frame.type === "event") this.accept(frame.event);
      else if (frame.type === "error") this.lastError = frame;
    };
    ws.onclose = (closed) => {
      if (this.ws !== ws) return;
      this.ws = null;
      clearTimeout(this.watchdog);
      if (this.stopped) return;
      if ([4401, 4403, 4404].includes(closed.code)) {
        this.stopped = true;
        this.setState("closed");
        if (this.onFatal) this.onFatal(closed.code, this.lastError);
        return;
      }
      this.scheduleReconnect();
    };
  }

  accept(event) {
    const at = this.cursorOf(event);
    if (this.cursor != null && at <= this.cursor) return; // already applied
    this.cursor = at;
    this.onEvent(event);
  }

  // A socket that says nothing for two heartbeats is dead even if not closed.
  kick() {
    clearTimeout(this.watchdog);
    this.watchdog = setTimeout(() => { if (this.ws) this.ws.close(); }, this.watchdogMs);
  }

  scheduleReconnect() {
    this.failures += 1;
    if (this.failures >= 2 && this.poll) this.startPolling();
    else if (this.state !== "polling") this.setState("reconnecting");
    const base = BACKOFF_MS[Math.min(this.failures - 1, BACKOFF_MS.length - 1)];
    this.reconnectTimer = setTimeout(() => this.connect(), base + Math.random() * 250);
  }

  // Simulate a lost connection (used by the tests and handy in the console).
  drop() { if (this.ws) this.ws.close(); }

  startPolling() {
    if (this.pollTimer) return;
    this.setState("polling");
    const tick = async () => {
      try {
        const events = await this.poll(this.cursor);
        for (const event of events || []) this.accept(event);
        if (this.cursor == null && this.onResync) this.onResync();
      } catch {
        showConnection("reconnecting");
      }
      if (this.pollTimer) this.pollTimer = setTimeout(tick, 2000);
    };
    this.pollTimer = setTimeout(tick, 0);
  }

  stopPolling() {
    if (this.pollTimer) clearTimeout(this.pollTimer);
    this.pollTimer = null;
  }
}

// Call fn at most once per `ms`, trailing (for refetches driven by many events).
export function throttle(fn, ms) {
  let timer = null;
  let last = 0;
  return () => {
    if (timer) return;
    const wait = Math.max(0, last + ms - Date.now());
    timer = setTimeout(() => { timer = null; last = Date.now(); fn(); }, wait);
  };
}
