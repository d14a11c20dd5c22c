// A run as a JavaScript client sees it, with the official NATS client and nothing of
// runwire's: submit, read the run's frames from the stream and subject the submit reply
// names, then `get` the run until `frames_complete` and compare `last_seq` with `done`.
// The run's text follows the contract: a resumed attempt's `run` frame cuts the text
// after `resume_after` (a seq, whatever the characters are), then its frames follow.
// Usage: node follow_run.mjs <nats url> <prefix> <tenant> <json array of tokens> [json fail]
// Prints one JSON object: what the client saw.
import { StringCodec, connect, consumerOpts } from "nats";

const [url, prefix, tenant, tokensJson, failJson] = process.argv.slice(2);
const sc = StringCodec();
const nc = await connect({ servers: url });

async function command(name, body) {
  const msg = await nc.request(`${prefix}.${tenant}.cmd.${name}`, sc.encode(JSON.stringify(body)), {
    timeout: 10000,
  });
  const reply = JSON.parse(sc.decode(msg.data));
  if (!reply.ok) throw new Error(`${name}: ${reply.error.code} ${reply.error.message}`);
  return reply;
}

const submitted = await command("submit", {
  v: 1,
  request_id: `node-${Date.now()}-${Math.random()}`,
  input: { tokens: JSON.parse(tokensJson), fail: failJson ? JSON.parse(failJson) : [] },
});
const { stream, subject } = submitted.frames;

// An ordered push consumer from the start of the run's subject: replay, then live.
const js = nc.jetstream();
const opts = consumerOpts();
opts.orderedConsumer();
opts.deliverAll();
opts.filterSubject(subject);
const sub = await js.subscribe(subject, opts);
const frames = [];
const timer = setTimeout(() => sub.unsubscribe(), 30000);
for await (const m of sub) {
  const frame = JSON.parse(sc.decode(m.data));
  frames.push(frame);
  if (frame.type === "done") break;
}
clearTimeout(timer);
const done = frames[frames.length - 1];

// `last_seq` is final once `frames_complete` says so.
let run = (await command("get", { v: 1, run_id: submitted.run.run_id })).run;
const deadline = Date.now() + 10000;
while (!run.frames_complete && Date.now() < deadline) {
  await new Promise((resolve) => setTimeout(resolve, 20));
  run = (await command("get", { v: 1, run_id: submitted.run.run_id })).run;
}

// The text by the contract's rule, and what slicing by `partial_length` (code points)
// as a JavaScript string (UTF-16 units) would make of it.
let pieces = [];
let sliced = "";
for (const f of frames) {
  if (f.type === "message") {
    pieces.push([f.seq, f.data.text]);
    sliced += f.data.text;
  } else if (f.type === "run" && f.data.resumed) {
    pieces = pieces.filter(([seq]) => seq <= f.data.resume_after);
    sliced = sliced.slice(0, f.data.partial_length);
  }
}
const text = pieces.map(([, t]) => t).join("");
process.stdout.write(
  JSON.stringify({
    stream,
    subject,
    text,
    sliced_by_partial_length: sliced,
    attempts: frames.filter((f) => f.type === "run").length,
    seqs: frames.map((f) => f.seq),
    done_seq: done ? done.seq : null,
    done_status: done ? done.data.status : null,
    status: run.status,
    last_seq: run.last_seq,
    frames_complete: run.frames_complete,
  }) + "\n",
);
await nc.close();
