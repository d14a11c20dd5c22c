// The official LangGraph JavaScript client, the same calls against LangGraph's own server
// and against runwire's gateway (tests/integration/test_langgraph_reference.py compares
// what it saw): a streamed chat, its thread and state, a wait, an interrupt and its
// resume, a reject conflict. Prints [label, value] pairs as JSON.
// usage: node langgraph_reference.mjs URL [API_KEY]
import { Client } from "@langchain/langgraph-sdk";

const [url, apiKey] = process.argv.slice(2);
const client = new Client({ apiUrl: url, apiKey: apiKey || undefined });
const seen = [];
const hello = { messages: [{ role: "user", content: "hi" }], reply: ["Hel", "lo"] };
const modes = ["values", "updates", "messages-tuple"];
const pick = (o, keys) => Object.fromEntries(keys.map((k) => [k, o[k] ?? null]));
const threadView = (t) => pick(t, ["thread_id", "status", "values", "metadata", "interrupts"]);

async function streamed(threadId, payload) {
  const events = [];
  for await (const part of client.runs.stream(threadId, "chat", payload)) {
    let data = part.data;
    if (part.event === "messages") {
      data = [data[0], pick(data[1], ["graph_id", "langgraph_node", "thread_id", "run_id"])];
    }
    events.push([part.event, data]);
  }
  return events;
}

const thread = await client.threads.create({ metadata: { from: "javascript" } });
const tid = thread.thread_id;
seen.push(["stream", await streamed(tid, { input: hello, streamMode: modes })]);
seen.push(["thread", threadView(await client.threads.get(tid))]);
const state = await client.threads.getState(tid);
seen.push(["state", pick(state, ["values", "next"])]);
const second = { messages: [{ role: "user", content: "again" }], reply: ["ok"] };
seen.push(["wait", await client.runs.wait(tid, "chat", { input: second })]);
const runs = await client.runs.list(tid);
seen.push(["runs", runs.map((r) => [r.run_id, r.status])]);

const asking = await client.threads.create();
const asked = await streamed(asking.thread_id, {
  input: { ...hello, ask: { question: "may I?" } },
  streamMode: ["values", "updates"],
});
seen.push(["asked", asked]);
seen.push(["interrupted", threadView(await client.threads.get(asking.thread_id))]);
const answered = await client.runs.wait(asking.thread_id, "chat", { command: { resume: "yes" } });
seen.push(["answered", answered.messages.map((m) => [m.type, m.content])]);

const busy = await client.runs.create(tid, "chat", { input: { reply: Array(40).fill("x"), delay_ms: 100 } });
for (let i = 0; i < 300; i++) {
  if ((await client.runs.get(tid, busy.run_id)).status === "running") break;
  await new Promise((r) => setTimeout(r, 50));
}
try {
  await client.runs.create(tid, "chat", { input: { reply: ["z"] }, multitaskStrategy: "reject" });
  seen.push(["conflict", "none"]);
} catch (error) {
  seen.push(["conflict", error.status ?? String(error)]);
}
await client.runs.cancel(tid, busy.run_id, true);
seen.push(["canceled", (await client.runs.get(tid, busy.run_id)).status]);
console.log(JSON.stringify(seen));
