// Run history: the tenant's runs from Postgres (`GET /v1/runs`, node runs not listed),
// filtered by status, runner, session and creation time, a page at a time, kept current
// by the tenant's run events; and a box that opens a run by its id.
"use strict";

import { $, RUN_ID, STATUSES, call, el, errorText, readable, sse, when } from "./api.js";

// The filters and the page shown: `cursors` holds the `before` of each page seen
// (null: the newest), so "Newer" goes back one.
let cursors = [null], next = null, loading = 0;
// run id -> its row's data, for the page shown.
const rows = new Map();
// Runs whose events named a status that a reload did not list (node runs, runs the
// filters leave out): no reload for them again at that status.
const absent = new Set();
let eventsAbort = null, reloadTimer = null;

export function setupHistory() {
  const status = $("f-status");
  status.append(el("option", { value: "", text: "any status" }));
  for (const s of STATUSES) status.append(el("option", { value: s, text: s }));
  $("f-apply").addEventListener("click", () => firstPage());
  $("filters").addEventListener("submit", (ev) => { ev.preventDefault(); firstPage(); });
  for (const id of ["f-status", "f-limit"]) $(id).addEventListener("change", () => firstPage());
  $("f-clear").addEventListener("click", () => {
    for (const id of ["f-status", "f-runner", "f-session", "f-after", "f-before"]) $(id).value = "";
    firstPage();
  });
  $("older").addEventListener("click", () => { if (next !== null) { cursors.push(next); load(); } });
  $("newer").addEventListener("click", () => { if (cursors.length > 1) { cursors.pop(); load(); } });
  $("open").addEventListener("submit", (ev) => {
    ev.preventDefault();
    openById();
  });
  $("open-go").addEventListener("click", openById);
}

function openById() {
  const runId = $("open-id").value.trim().toLowerCase();
  $("open-error").textContent = "";
  if (!RUN_ID.test(runId)) {
    $("open-error").textContent = "a run id looks like 0b7c2e8a-3f1d-4c55-9a0e-6d2f1b9c8e70";
    return;
  }
  location.hash = "#/runs/" + runId;
}

// A datetime-local input's value (the browser's time) as RFC 3339 in UTC.
function instant(id) {
  const value = $(id).value;
  if (!value) return null;
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? null : date.toISOString();
}

function query() {
  const params = new URLSearchParams({ limit: $("f-limit").value });
  const status = $("f-status").value, runner = $("f-runner").value.trim();
  const session = $("f-session").value.trim();
  if (status) params.set("status", status);
  if (runner) params.set("runner", runner);
  if (session) params.set("session_id", session);
  const after = instant("f-after"), before = instant("f-before");
  if (after) params.set("created_after", after);
  if (before) params.set("created_before", before);
  const cursor = cursors[cursors.length - 1];
  if (cursor !== null) params.set("before", String(cursor));
  return params;
}

export function firstPage() {
  cursors = [null];
  absent.clear();
  return load();
}

async function load() {
  const mine = ++loading;
  $("history-error").textContent = "";
  const [ok, reply] = await call("/v1/runs?" + query().toString());
  if (mine !== loading) return;  // a later load answers instead
  if (!ok) {
    $("history-error").textContent = errorText(reply);
    return;
  }
  next = reply.next;
  rows.clear();
  for (const run of reply.runs) rows.set(run.run_id, { ...run, event: null });
  draw();
}

function draw() {
  const body = $("runs");
  body.replaceChildren();
  for (const r of rows.values()) {
    const wait = r.status === "waiting" && r.waiting_for;
    const last = el("td", { class: "last" }, r.event ? r.event : "");
    if (wait) {
      const what = wait.kind === "signal" ? wait.name : readable(wait.payload);
      last.append(el("div", { class: "question", text: `${wait.kind}: ${what}` }));
    } else if (r.error && r.status !== "finished") {
      last.append(el("div", { class: "error", text: r.error.code }));
    }
    const tr = el("tr", { class: "run", "data-run": r.run_id },
      el("td", { class: "mono", title: r.run_id, text: r.run_id.slice(0, 8) }),
      el("td", { class: "status " + r.status, text: r.status }),
      el("td", { class: "runner", text: r.workflow ? `${r.workflow.release_id} v${r.workflow.version}` : r.runner || "" }),
      el("td", { class: "created", text: when(r.created_at) }),
      last);
    tr.addEventListener("click", () => { location.hash = "#/runs/" + r.run_id; });
    body.append(tr);
  }
  $("older").disabled = next === null;
  $("newer").disabled = cursors.length <= 1;
  $("page-note").textContent = rows.size ? `page ${cursors.length}` : "no runs";
}

// A run the page shows changed (its page learned it): its row follows.
export function runChanged(run) {
  const row = rows.get(run.run_id);
  if (!row) return;
  Object.assign(row, run);
  if (run.status !== "waiting") row.waiting_for = null;
  draw();
}

function scheduleReload() {
  clearTimeout(reloadTimer);
  reloadTimer = setTimeout(async () => {
    const pending = [...pendingUnknown];
    pendingUnknown.clear();
    await load();
    for (const seen of pending) if (!rows.has(seen.split(" ")[0])) absent.add(seen);
  }, 250);
}
const pendingUnknown = new Set();

// The tenant's run events, live: a listed run's row changes; a run not listed (a new
// one) reloads the newest page, which lists it if the filters do (a node run never).
export async function followEvents(onEvent) {
  if (eventsAbort) eventsAbort.abort();
  eventsAbort = new AbortController();
  const signal = eventsAbort.signal;
  while (!signal.aborted) {
    try {
      $("conn").textContent = "live";
      for await (const e of sse("/v1/events", null, signal)) {
        const ev = JSON.parse(e.data);
        onEvent(ev);
        const event = ev.event + (ev.node ? " " + ev.node : "") + (ev.code ? " " + ev.code : "");
        const row = rows.get(ev.run_id);
        if (row) {
          const waitingBefore = row.status === "waiting";
          Object.assign(row, { status: ev.status, attempts: ev.attempt, event });
          if (ev.status !== "waiting") row.waiting_for = null;
          else if (!waitingBefore) learnWait(ev.run_id);
          draw();
        } else if (cursors.length === 1 && !absent.has(ev.run_id + " " + ev.status)) {
          pendingUnknown.add(ev.run_id + " " + ev.status);
          scheduleReload();
        }
      }
    } catch (err) {
      if (signal.aborted) return;
      $("conn").textContent = "reconnecting";
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

// What a listed run waits for, from its summary.
async function learnWait(runId) {
  const [ok, reply] = await call("/v1/runs/" + runId);
  const row = rows.get(runId);
  if (ok && row && row.status === reply.run.status) {
    row.waiting_for = reply.run.waiting_for;
    draw();
  }
}
