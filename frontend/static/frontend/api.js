// Calls to the REST API with the session cookie and the CSRF token.

export class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.body = body;
    this.code = error.code || String(status);
    this.fields = error.fields || {};
  }
}

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

// Once a page has told the person their session expired (with a "log in again"
// link back to what they were doing), background reads must not whisk them to
// the login page before they have read it.
let loginRedirectHeld = false;
export function holdLoginRedirect() {
  loginRedirectHeld = true;
}

// redirectOn401: false lets the caller say what happened first (a decision
// whose session expired offers "log in again" and a way back to it).
export async function api(path, { method = "GET", body, signal, redirectOn401 = true } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET") headers["X-CSRFToken"] = csrfToken();
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
    signal,
  });
  if (response.status === 204) return null;
  let data = null;
  const text = await response.text();
  if (text) {
    try { data = JSON.parse(text); } catch { data = { error: { message: text.slice(0, 200) } }; }
  }
  if (response.status === 401 && redirectOn401 && !loginRedirectHeld) {
    window.location.assign(`/login/?next=${encodeURIComponent(location.pathname + location.search + location.hash)}`);
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

// A list endpoint's rows, whether it pages ({results}) or not.
export function rowsOf(data) {
  if (Array.isArray(data)) return data;
  if (data && Array.isArray(data.results)) return data.results;
  if (data && Array.isArray(data.events)) return data.events;
  if (data && Array.isArray(data.spans)) return data.spans;
  return [];
}

// Show field errors from a 400 next to their inputs: ids are `${prefix}-${field}-error`.
export function showFieldErrors(prefix, error, formErrorId) {
  document.querySelectorAll(`[id^="${prefix}-"][id$="-error"]`).forEach((el) => { el.textContent = ""; });
  document.querySelectorAll(`[id^="${prefix}-"][aria-invalid]`).forEach((el) => el.removeAttribute("aria-invalid"));
  if (!error) return;
  let placed = false;
  for (const [field, messages] of Object.entries(error.fields || {})) {
    const target = document.getElementById(`${prefix}-${field}-error`);
    const text = Array.isArray(messages) ? messages.join(" ") : typeof messages === "object" ? JSON.stringify(messages) : String(messages);
    if (target) {
      target.textContent = text;
      document.getElementById(`${prefix}-${field}`)?.setAttribute("aria-invalid", "true");
      placed = true;
    } else if (formErrorId) {
      document.getElementById(formErrorId).textContent += `${field}: ${text} `;
      placed = true;
    }
  }
  if (!placed && formErrorId) document.getElementById(formErrorId).textContent = error.message;
}
