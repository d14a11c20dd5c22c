// Submit a run and follow its frames with the official NATS JavaScript client alone: the
// submit is a request, the frames come from an ordered consumer made through the
// tenant's JetStream API prefix. Its settings come from the environment
// (`set -a; . .runwire/env`).
import { readFileSync } from "node:fs";
import { StringCodec, connect } from "nats";

const env = process.env;
const prefix = env.RUNWIRE_PREFIX ?? "rw";
const tenant = env.RUNWIRE_TENANT ?? "default";
const sc = StringCodec();
const nc = await connect({
  servers: (env.RUNWIRE_NATS_URL ?? "nats://127.0.0.1:4222").split(","),
  user: env.RUNWIRE_NATS_USER,
  pass: env.RUNWIRE_NATS_PASSWORD,
  tls: env.RUNWIRE_NATS_TLS_CA ? { ca: readFileSync(env.RUNWIRE_NATS_TLS_CA) } : undefined,
  inboxPrefix: `_INBOX_${tenant}`, // where a tenant's replies and deliveries go
});
const submit = { v: 1, request_id: crypto.randomUUID(), input: { tokens: ["Hi", " there"] } };
const answer = await nc.request(`${prefix}.${tenant}.cmd.submit`, sc.encode(JSON.stringify(submit)));
const { stream, subject } = JSON.parse(sc.decode(answer.data)).frames;

const js = nc.jetstream({ apiPrefix: `${prefix}.${tenant}.JS.API` }); // the tenant's JetStream API
const consumer = await js.consumers.get(stream, { filterSubjects: subject }); // ordered
let text = "";
for await (const m of await consumer.consume()) {
  const frame = JSON.parse(sc.decode(m.data));
  if (frame.type === "message") text += frame.data.text;
  if (frame.type === "done") {
    console.log(JSON.stringify(text), frame.data.status);
    break;
  }
}
await nc.close();
