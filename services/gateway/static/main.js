// The console: the API key, submitting a run, the run history and a run's page, and
// which run the address names (`#/runs/<id>`: a link to a run opens its page).
"use strict";

import { $, call, errorText, key } from "./api.js";
import { firstPage, followEvents, setupHistory } from "./history.js";
import { openRun, refreshRun, setupRun, view } from "./run.js";
import { setupWait } from "./wait.js";

const keyInput = $("key");
keyInput.value = key.get();

function start() {
  firstPage();
  followEvents((ev) => { if (ev.run_id === view.shown) refreshRun(); });
  route();
}

// A change of the key (typed, then the field left: a browser says so again on blur).
keyInput.addEventListener("change", () => {
  const value = keyInput.value.trim();
  if (value === key.get()) return;
  key.set(value);
  start();
});
$("forget-key").addEventListener("click", () => {
  key.set("");
  keyInput.value = "";
  location.reload();
});

$("submit").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("submit-error").textContent = "";
  let input;
  try {
    input = JSON.parse($("input").value);
  } catch (err) {
    $("submit-error").textContent = "input: " + err.message;
    return;
  }
  const body = { request_id: crypto.randomUUID(), runner: $("runner").value, input, multitask: $("multitask").value };
  if ($("session").value) body.session_id = $("session").value;
  const [ok, reply] = await call("/v1/runs", { method: "POST", body: JSON.stringify(body) });
  if (!ok) { $("submit-error").textContent = errorText(reply); return; }
  location.hash = "#/runs/" + reply.run.run_id;
});

function route() {
  const m = location.hash.match(/^#\/runs\/([^/]+)$/);
  if (!m || !key.get()) return;
  openRun(decodeURIComponent(m[1]).toLowerCase());
  // One column (a phone): the run's page is below the history; bring it into view.
  if (window.matchMedia("(max-width: 900px)").matches) $("run-view").scrollIntoView();
}
window.addEventListener("hashchange", route);

setupHistory();
setupRun();
setupWait();
if (key.get()) start();
