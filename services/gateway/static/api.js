// The console's talk with the gateway: the API key (this tab's session only), JSON
// requests, Server-Sent Events over fetch, and the one way text reaches the page.
"use strict";

export const $ = (id) => document.getElementById(id);

// A run id as Postgres writes it; nothing else is put in a link.
export const RUN_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
export const TERMINAL = ["finished", "failed", "canceled", "interrupted"];
export const STATUSES = ["queued", "running", "recovering", "waiting", ...TERMINAL];

// The key lives as long as the tab: sessionStorage, never localStorage (an older console
// kept it there: it is removed).
const KEY = "runwire.key";
localStorage.removeItem(KEY);
localStorage.removeItem("runwire.runs");
export const key = {
  get: () => sessionStorage.getItem(KEY) || "",
  set: (value) => (value ? sessionStorage.setItem(KEY, value) : sessionStorage.removeItem(KEY)),
};

export function headers() {
  return { "Authorization": "Bearer " + key.get(), "Content-Type": "application/json" };
}

// A request to the gateway: [ok, reply]; a reply that is no JSON becomes an error body.
export async function call(path, options = {}) {
  let response;
  try {
    response = await fetch(path, { headers: headers(), ...options });
  } catch (err) {
    return [false, { error: { code: "UNAVAILABLE", message: "the gateway did not answer: " + err.message } }];
  }
  let reply;
  try {
    reply = await response.json();
  } catch (err) {
    reply = { error: { code: String(response.status), message: response.statusText } };
  }
  return [response.ok, reply];
}

export const errorText = (reply) =>
  reply && reply.error ? `${reply.error.code}: ${reply.error.message}` : "no answer";

// Server-Sent Events over fetch (an EventSource cannot send the API key).
export async function* sse(path, lastEventId, signal) {
  const h = headers();
  if (lastEventId) h["Last-Event-ID"] = String(lastEventId);
  const response = await fetch(path, { headers: h, signal });
  if (!response.ok) throw new Error(errorText(await response.json().catch(() => null)));
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "", event = {};
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, cut).replace(/\r$/, "");
      buffer = buffer.slice(cut + 1);
      if (line === "") { if (event.data !== undefined) yield event; event = {}; continue; }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      event[line.slice(0, colon)] = line.slice(colon + 1).replace(/^ /, "");
    }
  }
}

// An element, its text set as text: every piece of data reaches the page through here
// (textContent, text nodes), never as HTML.
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null) continue;
    if (name === "text") node.textContent = String(value);
    else if (name === "class") node.className = value;
    else if (name.startsWith("data-")) node.setAttribute(name, String(value));
    else if (name === "title") node.title = String(value);
    else node[name] = value;
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

// A link to a run's page (only for a run id: nothing else becomes an href).
export function runLink(runId, text) {
  if (!RUN_ID.test(runId)) return el("span", { class: "mono", text: text || runId });
  return el("a", { href: "#/runs/" + runId, class: "mono", text: text || runId });
}

// A payload as a person reads it: text as text, anything else as compact JSON.
export function readable(payload) {
  if (payload === null || payload === undefined) return "";
  return typeof payload === "string" ? payload : JSON.stringify(payload);
}

export function waitKind(wait) {
  if (wait.kind === "signal") return `the signal ${wait.name} (signal)`;
  if (wait.kind === "sleep") return "a timer (sleep)";
  return "an answer (interrupt)";
}

export function when(at) {
  if (!at) return "";
  const date = new Date(at);
  return Number.isNaN(date.getTime()) ? String(at) : date.toLocaleString();
}

export const clip = (text, most = 240) => (text.length > most ? text.slice(0, most) + "…" : text);
