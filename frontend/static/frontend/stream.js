// Follow a WebSocket stream with resume by cursor (seq for a run, id for the
// tenant): after any disconnect the page asks for everything after the last
// event it holds, so it has every event exactly once. While the socket cannot
// connect, the page says so ("reconnecting") and polls instead.
//
// "Live" is said only while frames arrive: the server sends a heartbeat every
// `heartbeat_seconds` (told in its hello frame), so two intervals without any
// frame mean the socket is stale even if the browser has not noticed (offline,
// a dead proxy); the page says so and reconnects.

import { holdLoginRedirect } from "./api.js";
import { showConnection } from "./format.js";

const BACKOFF_MS = [500, 1000, 2000, 4000, 8000];
const STALE_AFTER_HEARTBEATS = 2;
// Tabs of one browser share the session: logging out in one ends every tab's
// streams (the server would go on serving a socket opened before the logout).
const session = typeof BroadcastChannel === "function" ? new BroadcastChannel("cp-session") : null;
const streams = new Set();

function stopAll(state) {
  for (const stream of streams) stream.stop(state);
  // A read in flight as the session ends answers 401: the tab says "Logged
  // out" and stays where it is rather than jump to the login page.
  if (state === "logged_out") holdLoginRedirect();
}

if (session) session.onmessage = (message) => { if (message.data === "logout") stopAll("logged_out"); };
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (!(form instanceof HTMLFormElement) || !new URL(form.action, location.href).pathname.endsWith("/logout/")) return;
  stopAll("logged_out");
  if (session) session.postMessage("logout");
}, true);

export class Stream {
  // path: "/ws/runs/<id>/"; cursorParam: "after_seq" | "after_id";
  // cursor: the last seq/id the page holds (null: live only);
  // onEvent(event); onResync(): refetch after (re)connect when no cursor;
  // poll(cursor) -> events after cursor (null: nothing to poll);
  // heartbeatSeconds: the interval assumed until the server's hello says it.
  // onDelta(frame): live text of a running span (not in the log; display only).
  // quiet: a stream the page follows beside its own (a sub-agent's run): its
  // state is its own, the header's connection badge stays the page's stream's.
  constructor({ path, cursorParam, cursor = null, cursorOf, onEvent, onDelta, onResync, poll, onFatal, heartbeatSeconds = 20, quiet = false }) {
    Object.assign(this, { path, cursorParam, cursor, cursorOf, onEvent, onDelta, onResync, poll, onFatal, quiet });
    this.failures = 0;
    this.state = "connecting";
    this.heartbeatMs = heartbeatSeconds * 1000;
    this.stopped = false;
    this.pollTimer = null;
    this.reconnectTimer = null;
    streams.add(this);
    window.cpStreams = window.cpStreams || [];
    window.cpStreams.push(this);
  }

  start() { this.connect(); return this; }

  // state: what the header says afterwards ("closed" unless told otherwise).
  stop(state = "closed") {
    this.stopped = true;
    clearTimeout(this.reconnectTimer);
    clearTimeout(this.watchdog);
    this.stopPolling();
    const ws = this.ws;
    this.ws = null;
    if (ws) ws.close(1000, "page closed the stream");
    this.setState(state);
  }

  setState(state, detail = "") {
    this.state = state;
    if (this.quiet) return;
    document.body.dataset.stream = state;
    showConnection(state, detail);
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
      this.kick(); // "Live" once the first frame (the hello) arrives
      if (this.cursor == null && this.onResync) this.onResync();
    };
    ws.onmessage = (message) => {
      if (this.ws !== ws) return;
      let frame;
      try { frame = JSON.parse(message.data); } catch { return; }
      if (frame.type === "hello" && frame.heartbeat_seconds > 0) this.heartbeatMs = frame.heartbeat_seconds * 1000;
      this.kick();
      if (frame.type === "error") { this.lastError = frame; return; }
      if (this.state !== "live") this.setState("live");
      if (frame.type === "event") this.accept(frame.event);
      else if (frame.type === "delta" && this.onDelta) this.onDelta(frame);
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

  // A socket that says nothing for two heartbeats is stale even if not closed:
  // stop saying "Live" and reconnect (its close handshake may never finish, so
  // it is let go at once).
  kick() {
    clearTimeout(this.watchdog);
    const ms = this.heartbeatMs * STALE_AFTER_HEARTBEATS;
    this.watchdog = setTimeout(() => this.stale(ms), ms);
  }

  stale(ms) {
    const ws = this.ws;
    if (!ws || this.stopped) return;
    this.ws = null;
    ws.close(4000, "no frame for two heartbeats");
    this.setState("stale", `(nothing for ${Math.round(ms / 1000)} s)`);
    this.scheduleReconnect();
  }

  scheduleReconnect() {
    this.failures += 1;
    if (this.failures >= 2 && this.poll) this.startPolling();
    else if (this.state !== "polling" && this.state !== "stale") this.setState("reconnecting");
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
        if (!this.quiet) showConnection("reconnecting");
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
