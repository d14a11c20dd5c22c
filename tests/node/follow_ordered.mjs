// A tenant follows a run as the official NATS JavaScript client's own idiom has it: an
// ordered consumer (`js.consumers.get(stream, { filterSubjects })`, then `consume()`),
// through the tenant's JetStream API prefix, from a stream sequence (1: the start).
// Usage: node follow_ordered.mjs <nats url> <user> <password> <inbox prefix> <api prefix>
//        <stream> <subject> <start seq> [add]
// Prints one JSON object, {seqs, text, events, notices}, once the run's `done` frame (or,
// on the events stream, the event that ends it) arrives; `notices` are the consumer's own
// status notifications (a missed heartbeat, a reset), for a failing test to show. With
// `add`, it makes a consumer of the subject with the client's manager instead (an ordered
// consumer retries a refused creation without end) and prints what the server said.
// On a cluster, nats-server drops a pull whose reply inbox its route has not yet heard
// of; the client notices only when two idle heartbeats are missed (30 s with its
// defaults) and pulls again, so the script waits 75 s, past that recovery.
import { AckPolicy, StringCodec, connect } from "nats";

const [url, user, pass, inboxPrefix, apiPrefix, stream, subject, start, mode] =
  process.argv.slice(2);
const sc = StringCodec();
const ENDED = ["finished", "failed", "canceled", "interrupted"];
const nc = await connect({ servers: url, user, pass, inboxPrefix });
if (mode === "add") {
  const jsm = await nc.jetstreamManager({ apiPrefix });
  try {
    await jsm.consumers.add(stream, { filter_subject: subject, ack_policy: AckPolicy.None });
    process.stdout.write(JSON.stringify({ made: true }));
  } catch (err) {
    process.stdout.write(JSON.stringify({ made: false, error: err.message }));
  }
  await nc.close();
  process.exit(0);
}
const js = nc.jetstream({ apiPrefix });
const consumer = await js.consumers.get(stream, {
  filterSubjects: subject,
  opt_start_seq: Number(start),
});
const messages = await consumer.consume();
const notices = [];
(async () => {
  for await (const status of await messages.status()) {
    if (status.type !== "next") notices.push(status);
  }
})();
const seqs = [];
const events = [];
let text = "";
const timer = setTimeout(() => messages.stop(), 75000);
for await (const m of messages) {
  const frame = JSON.parse(sc.decode(m.data));
  if (frame.event !== undefined) {
    // A run event (the events stream): followed until the run has ended.
    events.push(frame.event);
    if (ENDED.includes(frame.event)) break;
    continue;
  }
  seqs.push(frame.seq);
  if (frame.type === "message") text += frame.data.text;
  if (frame.type === "done") break;
}
clearTimeout(timer);
await nc.close();
process.stdout.write(JSON.stringify({ seqs, text, events, notices }));
