// The official LangGraph JavaScript client against runwire's gateway: a thread, a streamed
// run, a run that waits, a conflict. Prints what it saw as JSON.
// usage: node langgraph_stream.mjs GATEWAY_URL API_KEY
import { Client } from "@langchain/langgraph-sdk";

const [url, apiKey] = process.argv.slice(2);
const client = new Client({ apiUrl: url, apiKey });
const seen = { events: [], chunks: [] };

const thread = await client.threads.create({ metadata: { from: "javascript" } });
seen.thread = thread.thread_id;
for await (const part of client.runs.stream(thread.thread_id, "scripted", {
  input: { tokens: ["Grüße ", "aus ", "JavaScript"] },
  streamMode: ["messages-tuple", "values"],
})) {
  seen.events.push(part.event);
  if (part.event === "messages") seen.chunks.push(part.data[0].content);
  if (part.event === "metadata") seen.run_id = part.data.run_id;
}
seen.run = (await client.runs.get(thread.thread_id, seen.run_id)).status;
seen.waited = await client.runs.wait(null, "scripted", { input: { tokens: ["waited"] } });

const busy = await client.runs.create(thread.thread_id, "scripted", {
  input: { tokens: ["x", "y"], token_delay_ms: 2000 },
});
try {
  await client.runs.create(thread.thread_id, "scripted", {
    input: { tokens: ["z"] },
    multitaskStrategy: "reject",
  });
  seen.conflict = "none";
} catch (error) {
  seen.conflict = error.status ?? String(error);
}
await client.runs.cancel(thread.thread_id, busy.run_id, true);
seen.canceled = (await client.runs.get(thread.thread_id, busy.run_id)).status;
console.log(JSON.stringify(seen));
