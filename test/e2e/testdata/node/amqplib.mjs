// amqplib.mjs URL IN OUT: publishes messages with x-delay headers to queue
// IN as amqplib users do (numbers as amqplib types them: by their value),
// then prints each message consumed from queue OUT as a JSON line (after: ms
// since just before publishing).
import amqp from "amqplib";

const [url, inQ, outQ] = process.argv.slice(2);
const conn = await amqp.connect(url);
const ch = await conn.createConfirmChannel();
await ch.assertQueue(outQ, { durable: true });
const sent = [
  ["small int", { "x-delay": 900 }, {}],
  ["typed", { "x-delay": 1100, n: 70000, f: 1.5, neg: -3, flag: true, nested: { a: 1 }, list: [1, "x"] }, {}],
  ["properties", { "x-delay": "1s" }, { contentType: "application/json", correlationId: "c1", replyTo: "r1", messageId: "amqp-3", priority: 2 }],
  ["long", { "x-delay": { "!": "long", value: 1200 } }, {}],
];
let got = 0;
const t0 = Date.now();
const done = new Promise((resolve) => {
  ch.consume(outQ, (m) => {
    const { headers, ...props } = m.properties;
    console.log(JSON.stringify({ after: Date.now() - t0, body: m.content.toString(), props, headers }));
    ch.ack(m);
    if (++got === sent.length) resolve();
  });
});
for (const [body, headers, props] of sent) {
  ch.sendToQueue(inQ, Buffer.from(body), { headers, persistent: true, ...props });
}
await ch.waitForConfirms();
await done;
await conn.close();
