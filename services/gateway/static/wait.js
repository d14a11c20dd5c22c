// Answering a run that waits: Approve, Reject (with a reason), a typed Answer, or a
// signal. A wait that is over (the run's stream went past it, or this page answered it)
// never shows again, so a summary read a moment too late does not bring it back.
"use strict";

import { $, call, errorText, readable, waitKind } from "./api.js";
import { refreshRun, save, view } from "./run.js";

const BUTTONS = ["approve", "reject", "answer-send", "signal-send"];
let currentWait = null, waitShown = null;

// What the shown run waits for, with the ways to answer it; null hides them. What was
// typed stays while the wait is the same (a wait's id is unique within its run).
export function drawWait(wait) {
  $("wait").hidden = !wait;
  if (!wait) { waitShown = null; return; }
  if (waitShown === wait.wait_id) return;
  waitShown = wait.wait_id;
  const until = wait.timeout_at ? " until " + new Date(wait.timeout_at).toLocaleString() : "";
  $("wait-kind").textContent = waitKind(wait) + until;
  $("wait-question").textContent = readable(wait.payload);
  $("wait-question").hidden = wait.payload === null || wait.payload === undefined;
  $("wait-interrupt").hidden = wait.kind !== "interrupt";
  $("wait-signal").hidden = wait.kind !== "signal";
  for (const id of ["reject-reason", "answer", "signal-payload"]) $(id).value = "";
  for (const id of BUTTONS) $(id).disabled = false;
  $("wait-note").textContent = "";
}

// The shown run's wait: the one its stream has open, else the one its summary said last.
export function showWait() {
  const state = view.state;
  if (!state) return drawWait(null);
  const open = (wait) => (wait && !state.passed.includes(wait.wait_id) ? wait : null);
  currentWait = open(state.wait) || open(view.gotWait);
  drawWait(currentWait);
}

// What a person types is JSON when it parses as JSON, else the text.
function typed(text) {
  const trimmed = text.trim();
  if (trimmed === "") return undefined;
  try { return JSON.parse(trimmed); } catch (err) { return trimmed; }
}

async function answer(path, body, done) {
  const wait = currentWait, runId = view.shown, state = view.state;
  if (!runId || !wait) return;
  $("wait-error").textContent = "";
  $("wait-note").textContent = "";
  for (const id of BUTTONS) $(id).disabled = true;
  const [ok, reply] = await call("/v1/runs/" + runId + path, { method: "POST",
    body: JSON.stringify({ request_id: crypto.randomUUID(), ...body }) });
  if (runId !== view.shown) return;
  if (!ok) {
    $("wait-error").textContent = errorText(reply) + (reply.error && reply.error.code === "NOT_WAITING"
      ? " (it was answered already, or it ended: see its status)" : "");
    for (const id of BUTTONS) $(id).disabled = false;
  } else {
    state.passed.push(wait.wait_id);
    save(runId, state);
    showWait();
    $("wait-note").textContent = done(reply);
  }
  refreshRun();
}

function resume(value) {
  return answer("/resume", { value, wait_id: currentWait.wait_id }, () => "Answered: the run goes on.");
}

export function setupWait() {
  $("approve").addEventListener("click", () => resume({ approved: true }));
  $("reject").addEventListener("click", () => {
    const reason = $("reject-reason").value.trim();
    resume(reason ? { approved: false, reason } : { approved: false });
  });
  $("answer-send").addEventListener("click", () => {
    const value = typed($("answer").value);
    if (value === undefined) { $("wait-error").textContent = "type an answer first"; return; }
    resume(value);
  });
  $("signal-send").addEventListener("click", () => {
    if (!currentWait) return;
    const payload = typed($("signal-payload").value);
    answer("/signal", { name: currentWait.name, payload: payload === undefined ? null : payload },
      (reply) => reply.delivered ? "Signal sent: the run goes on." : "Signal sent: kept until the run waits for it.");
  });
}
