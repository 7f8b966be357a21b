// natsjs.mjs URL IN_SUBJECT OUT_SUBJECT: publishes to JetStream on
// IN_SUBJECT with x-delay headers as nats.js users do (header names as
// they write them), then prints each message received on OUT_SUBJECT as a
// JSON line (after: ms since just before publishing).
import { connect, headers as newHeaders } from "nats";

const [url, inSubject, outSubject] = process.argv.slice(2);
const nc = await connect({ servers: url });
const js = nc.jetstream();
const sub = nc.subscribe(outSubject);
const sent = [
  ["lower", { "x-delay": "1500ms" }],
  ["mixed case", { "X-Delay": "1200ms" }],
  ["milliseconds", { "x-delay": "900" }],
  ["with id", { "x-delay": "1s", "x-message-id": "js-4", "Content-Type": "application/json" }],
];
const t0 = Date.now();
for (const [body, hs] of sent) {
  const h = newHeaders();
  for (const [k, v] of Object.entries(hs)) h.set(k, v);
  await js.publish(inSubject, new TextEncoder().encode(body), { headers: h });
}
let got = 0;
for await (const m of sub) {
  const headers = {};
  if (m.headers) for (const [k, v] of m.headers) headers[k] = v.join(",");
  console.log(JSON.stringify({ after: Date.now() - t0, body: new TextDecoder().decode(m.data), headers }));
  if (++got === sent.length) break;
}
await nc.close();
