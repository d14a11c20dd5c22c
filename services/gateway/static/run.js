// A run's page: its summary (status, attempts, result or error, effects, a workflow's
// nodes), its text as it arrives and what its frames say (attempts, tool calls, usage,
// frames), kept across a reload (in this tab's storage, with the seq of the last frame
// shown) so that it goes on from there. Cancel only while the run can still be canceled.
"use strict";

import { $, RUN_ID, TERMINAL, call, el, errorText, readable, runLink, sse, waitKind, when } from "./api.js";
import { drawBudget, drawEffects, drawFrames, drawTools, drawUsage, fold, freshState } from "./details.js";
import { runChanged } from "./history.js";
import { drawWait, showWait } from "./wait.js";
import { drawNodes } from "./workflow.js";

// What the page shows: the run, its state from its frames, its summary's effects.
export const view = { shown: null, state: null, summary: null, gotWait: null };
let framesAbort = null, refreshTimer = null;

function saved(runId) {
  return { ...freshState(), ...JSON.parse(sessionStorage.getItem("runwire.run." + runId) || "{}") };
}
export function save(runId, state) {
  try {
    sessionStorage.setItem("runwire.run." + runId, JSON.stringify(state));
  } catch (err) {
    // Full: forget the runs kept (not the key); a run's page then reads it again from
    // its first frame.
    for (const name of Object.keys(sessionStorage))
      if (name.startsWith("runwire.run.")) sessionStorage.removeItem(name);
  }
}

function drawRun(state) {
  $("text").textContent = state.pieces.map((p) => p[1]).join("");
  $("timeline").replaceChildren(...state.timeline.map((t) => el("li", { text: t })));
  drawTools($("tools"), state.tools);
  drawUsage($("usage"), state.usage);
  drawEffects($("effects"), view.summary ? view.summary.effects : [], state.effects);
  drawFrames($("frames"), $("frame-count"), state);
}

const QUEUED_FOR = {
  session: "its session: an earlier run of it is active",
  concurrency_key: "its concurrency key: its runs hold the tenant's limit",
  share: "its tenant's share of executor slots",
  time: "its start time",
};

function drawSummary(run) {
  $("run-status").textContent = run.status;
  $("run-status").className = "status " + run.status;
  $("run-attempts").textContent = run.attempts;
  // Cancel acts on a run that has not ended; on an ended one it would change nothing.
  $("cancel").disabled = TERMINAL.includes(run.status);
  $("cancel").title = $("cancel").disabled ? `the run is ${run.status}: nothing to cancel` : "";
  const meta = $("run-meta");
  meta.replaceChildren();
  const row = (name, ...value) => meta.append(el("dt", { text: name }), el("dd", {}, ...value));
  if (run.workflow) row("workflow", `${run.workflow.release_id} v${run.workflow.version}`);
  else if (run.runner) row("runner", run.runner);
  if (run.parent_run_id) row("node", `${run.node_id} of `, runLink(run.parent_run_id, "its workflow run"));
  if (run.session_id) row("session", run.session_id);
  if (run.priority) row("priority", String(run.priority));
  if (run.concurrency_key) row("concurrency key", run.concurrency_key);
  // A queued run without a job yet: what it waits for before an executor may take it.
  if (run.queued_for === "rate_limit") {
    row("waits for", `room under rate limit ${run.limit_key}, until ${when(run.not_before)} at the latest`);
  } else if (run.queued_for) {
    row("waits for", QUEUED_FOR[run.queued_for] || run.queued_for);
  }
  row("created", when(run.created_at));
  if (run.started_at) row("started", when(run.started_at));
  if (run.ended_at) row("ended", when(run.ended_at));
  $("run-error").textContent = run.error ? `${run.error.code}: ${run.error.message}` : "";
  $("run-result").textContent = run.result ? JSON.stringify(run.result, null, 2) : "";
  $("run-result-box").hidden = !run.result;
  $("workflow-box").hidden = !run.workflow;
  if (run.workflow) drawNodes($("nodes"), run.nodes);
  drawEffects($("effects"), run.effects, view.state ? view.state.effects : {});
  drawBudget($("budget"), run.budget);
}

export async function refreshRun() {
  const runId = view.shown;
  if (!runId) return;
  const [ok, reply] = await call("/v1/runs/" + runId);
  if (runId !== view.shown) return;
  if (!ok) {
    $("run-load-error").textContent = errorText(reply);
    return;
  }
  $("run-load-error").textContent = "";
  const run = view.summary = reply.run;
  drawSummary(run);
  view.gotWait = run.status === "waiting" ? run.waiting_for : null;
  showWait();
  runChanged({ run_id: runId, status: run.status, attempts: run.attempts, waiting_for: run.waiting_for });
}

// The summary again, soon (node and effect frames come in bursts).
function refreshSoon() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(refreshRun, 200);
}

function apply(state, frame) {
  const d = frame.data;
  const at = frame.at ? " " + new Date(frame.at).toLocaleTimeString() : "";
  if (frame.type === "message") state.pieces.push([frame.seq, d.text]);
  if (frame.type === "run") {
    if (d.resumed && d.resume_after !== undefined && d.resume_after !== null)
      state.pieces = state.pieces.filter((p) => p[0] <= d.resume_after);
    state.timeline.push(`attempt ${d.attempt} started${at}` + (d.resumed ? ", continuing the text so far" : ""));
  }
  if (frame.type === "error") state.timeline.push(`error ${d.code}: ${d.message}` + (d.retryable ? " (retried)" : ""));
  if (frame.type === "wait") state.timeline.push(`waits for ${waitKind(d)}` +
    (d.kind === "interrupt" ? ": " + readable(d.payload) : ""));
  if (frame.type === "node") state.timeline.push(`node ${d.node_id}: ${d.action}` +
    (d.fallback ? ` (fallback ${d.fallback})` : "") + (d.code ? " " + d.code : ""));
  if (frame.type === "done") state.timeline.push(`done: ${d.status}` + (d.code ? " " + d.code : "") + at);
  // A wait lasts until the next attempt starts (it was answered) or the run ends.
  if (frame.type === "wait") state.wait = d;
  if ((frame.type === "run" || frame.type === "done") && state.wait) {
    state.passed.push(state.wait.wait_id);
    state.wait = null;
  }
  fold(state, frame);
  state.seq = frame.seq;
}

export async function openRun(runId) {
  if (framesAbort) framesAbort.abort();
  view.shown = runId;
  view.summary = null;
  view.gotWait = null;
  $("run-view").hidden = false;
  $("run-id").textContent = runId;
  for (const id of ["wait-error", "wait-note", "run-error", "run-load-error", "run-status", "run-attempts"])
    $(id).textContent = "";
  $("run-meta").replaceChildren();
  $("budget").replaceChildren();
  $("cancel").disabled = true;  // until the run's summary says it can act
  $("workflow-box").hidden = true;
  $("run-result-box").hidden = true;
  drawWait(null);
  if (!RUN_ID.test(runId)) { $("run-load-error").textContent = "not a run id"; return; }
  const state = view.state = saved(runId);
  drawRun(state);
  showWait();
  refreshRun();
  framesAbort = new AbortController();
  const signal = framesAbort.signal;
  while (!signal.aborted) {
    try {
      for await (const e of sse("/v1/runs/" + runId + "/frames", state.seq, signal)) {
        const frame = JSON.parse(e.data);
        if (frame.seq <= state.seq) continue;
        apply(state, frame);
        save(runId, state);
        if (runId !== view.shown) return;
        drawRun(state);
        if (["wait", "run", "done"].includes(frame.type)) showWait();
        if (["node", "effect", "run", "error"].includes(frame.type)) refreshSoon();
        if (frame.type === "done") { refreshRun(); return; }
      }
    } catch (err) {
      if (signal.aborted) return;
    }
    await new Promise((r) => setTimeout(r, 500));
  }
}

export function setupRun() {
  $("cancel").addEventListener("click", async () => {
    if (!view.shown) return;
    $("cancel").disabled = true;
    const [ok, reply] = await call("/v1/runs/" + view.shown + "/cancel", { method: "POST" });
    if (!ok) $("run-load-error").textContent = errorText(reply);
    refreshRun();
  });
}
