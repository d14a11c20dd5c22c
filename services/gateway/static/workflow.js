// A workflow run's nodes as a tree: each slot (a node of the graph) with the node runs
// that filled it, a fallback under the node it stood in for. A node whose failure its
// fallback handled reads as handled, not as a failure of the run.
"use strict";

import { el, readable, runLink } from "./api.js";

const FAILED = ["failed", "timed_out"];

// nodes: the summary's `nodes` (node runs, in the order they were created).
export function drawNodes(box, nodes) {
  box.replaceChildren();
  const slots = new Map();
  for (const node of nodes) {
    if (!slots.has(node.slot)) slots.set(node.slot, []);
    slots.get(node.slot).push(node);
  }
  const tree = el("ul", { class: "tree" });
  for (const [slot, chain] of slots) {
    // Its own node first, then each fallback in the order they ran.
    chain.sort((a, b) => (a.node_id === slot ? -1 : b.node_id === slot ? 1 : 0));
    tree.append(slotItem(slot, chain));
  }
  box.append(tree);
}

function slotItem(slot, chain) {
  const last = chain[chain.length - 1];
  const item = el("li", { class: "slot", "data-slot": slot, "data-state": last.status });
  let parent = item;
  chain.forEach((node, depth) => {
    const handledBy = FAILED.includes(node.status) ? chain[depth + 1] : undefined;
    const line = nodeLine(node, slot, handledBy);
    if (depth === 0) {
      parent.append(line);
    } else {
      const nested = el("ul", { class: "fallbacks" }, el("li", {}, line));
      parent.append(nested);
      parent = nested.firstChild;
    }
  });
  return item;
}

function nodeLine(node, slot, handledBy) {
  const state = handledBy ? "handled" : node.status;
  const line = el("div", { class: "node", "data-node": node.node_id, "data-state": state },
    el("span", { class: "node-id", text: node.node_id }), " ",
    el("span", { class: "badge " + state, text: handledBy ? `${node.status}, handled` : node.status }),
    el("span", { class: "muted", text: ` attempt ${node.attempt} · ` }),
    runLink(node.node_run_id, "node run"));
  if (node.node_id !== slot) line.append(el("div", { class: "muted", text: `fallback in place of ${slot}` }));
  if (node.error) {
    const code = node.error.code ? node.error.code + ": " : "";
    line.append(el("div", { class: handledBy ? "muted" : "error", text: code + (node.error.message || "") }));
  }
  if (handledBy) line.append(el("div", { class: "note", text: `its fallback ${handledBy.node_id} ran in its place` }));
  if (node.waiting_for) {
    const wait = node.waiting_for;
    const what = wait.kind === "signal" ? `the signal ${wait.name} (send it to the workflow run)`
      : wait.kind === "sleep" ? "a timer" : `an answer to ${readable(wait.payload)} (open the node run)`;
    line.append(el("div", { class: "question", text: "waits for " + what }));
  }
  return line;
}
