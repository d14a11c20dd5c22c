// What a run did, from its frames: tool calls with their results, the tokens its model
// calls used, its side effects and where each stands, and the frames themselves.
"use strict";

import { clip, el, readable, when } from "./api.js";

// How many frames the page keeps to show (the newest); the rest are counted.
const FRAMES_KEPT = 300;

// A frame, folded into the run's state (kept in this tab's storage with the text).
export function fold(state, frame) {
  const d = frame.data;
  if (frame.type === "tool_call") {
    state.tools[d.id] = { ...(state.tools[d.id] || {}), id: d.id, name: d.name, arguments: d.arguments, at: frame.at };
  } else if (frame.type === "tool_result") {
    const call = state.tools[d.id] || { id: d.id, name: d.name, arguments: null, at: frame.at };
    state.tools[d.id] = { ...call, done: true, output: d.output, error: d.error };
  } else if (frame.type === "usage") {
    const u = state.usage;
    u.calls += 1;
    u.input += d.input_tokens;
    u.output += d.output_tokens;
    u.total += d.total_tokens;
    if (d.model) u.models[d.model] = (u.models[d.model] || 0) + d.total_tokens;
  } else if (frame.type === "effect") {
    state.effects[d.key] = { ...d };
  }
  const brief = frame.type === "message" ? JSON.stringify(d.text) : JSON.stringify(d);
  state.frames.push([frame.seq, frame.type, frame.at, clip(brief, 200)]);
  if (state.frames.length > FRAMES_KEPT) {
    state.framesDropped = (state.framesDropped || 0) + state.frames.length - FRAMES_KEPT;
    state.frames = state.frames.slice(-FRAMES_KEPT);
  }
}

export function freshState() {
  return { seq: 0, pieces: [], timeline: [], passed: [], tools: {}, effects: {}, frames: [],
    usage: { calls: 0, input: 0, output: 0, total: 0, models: {} } };
}

export function drawTools(box, tools) {
  box.replaceChildren();
  const calls = Object.values(tools);
  if (!calls.length) { box.append(el("p", { class: "muted", text: "no tool calls" })); return; }
  for (const call of calls) {
    const outcome = !call.done ? el("div", { class: "muted", text: "no result yet" })
      : call.error ? el("div", { class: "error", text: "error: " + call.error })
      : el("pre", { class: "json", text: clip(readable(call.output), 2000) });
    box.append(el("div", { class: "tool", "data-tool": call.id },
      el("div", {}, el("b", { text: call.name }), el("span", { class: "muted mono", text: " " + call.id })),
      el("pre", { class: "json", text: clip(JSON.stringify(call.arguments), 2000) }),
      outcome));
  }
}

export function drawUsage(box, usage) {
  box.replaceChildren();
  if (!usage.calls) { box.append(el("p", { class: "muted", text: "no model calls reported" })); return; }
  box.append(el("p", { text: `${usage.calls} model call${usage.calls === 1 ? "" : "s"}: ` +
    `${usage.input} tokens in, ${usage.output} out, ${usage.total} in all` }));
  for (const [model, total] of Object.entries(usage.models))
    box.append(el("div", { class: "muted", text: `${model}: ${total} tokens` }));
}

// budget: the summary's (a run's own limits, what its costly calls used and hold).
export function drawBudget(box, budget) {
  box.replaceChildren();
  if (!budget) return;
  const amount = (used, limit, unit) =>
    limit === null || limit === undefined ? `${used} ${unit} (no limit of its own)` : `${used} of ${limit} ${unit}`;
  if (!budget.calls && budget.tokens === null && budget.cost === null) {
    box.append(el("p", { class: "muted", text: "no budget of its own, no costly calls" }));
    return;
  }
  box.append(el("p", { text: `${budget.calls} costly call${budget.calls === 1 ? "" : "s"}: ` +
    `${amount(budget.tokens_used, budget.tokens, "tokens")} used, ` +
    `${amount(budget.cost_used, budget.cost, "cost units")} used` }));
  if (budget.tokens_reserved || budget.cost_reserved)
    box.append(el("p", { class: "muted", text: `held now: ${budget.tokens_reserved} tokens, ` +
      `${budget.cost_reserved} cost units` }));
}

// effects: the frames' (live), and the summary's (where each stands in Postgres; the
// page reads it again after each effect frame).
export function drawEffects(box, fromSummary, fromFrames) {
  box.replaceChildren();
  const byKey = new Map();
  for (const e of Object.values(fromFrames)) byKey.set(e.key, e);
  for (const e of fromSummary) byKey.set(e.key, e);  // read after the frames: as Postgres has it
  if (!byKey.size) { box.append(el("p", { class: "muted", text: "no side effects" })); return; }
  const table = el("table", {}, el("thead", {}, el("tr", {},
    ...["key", "kind", "state", "receipt / error"].map((h) => el("th", { text: h })))));
  const body = el("tbody");
  for (const e of byKey.values()) {
    body.append(el("tr", { class: "effect", "data-effect": e.key },
      el("td", { class: "mono", text: e.key }), el("td", { text: e.kind }),
      el("td", { class: "badge " + e.state, text: e.state }),
      el("td", { class: e.error ? "error" : "mono", text: e.error || e.receipt_id || "" })));
  }
  table.append(body);
  box.append(table);
}

export function drawFrames(box, count, state) {
  count.textContent = String(state.seq);
  box.replaceChildren();
  if (state.framesDropped) box.append(el("tr", {}, el("td", { colSpan: 4, class: "muted",
    text: `${state.framesDropped} earlier frames not shown` })));
  for (const [seq, type, at, brief] of state.frames) {
    box.append(el("tr", { class: "frame" }, el("td", { text: seq }), el("td", { text: type }),
      el("td", { class: "muted", text: when(at) }), el("td", { class: "mono", text: brief })));
  }
}
