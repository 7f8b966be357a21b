// kafkajs.mjs BROKER IN OUT: publishes records with x-delay headers to IN as
// kafkajs users do, then prints each record read from OUT as a JSON line
// (after: ms since just before publishing; null key, value or header: null).
import kafkajs from "kafkajs";

const { Kafka, logLevel } = kafkajs;
const [broker, inTopic, outTopic] = process.argv.slice(2);
const kafka = new Kafka({ clientId: "e2e-js", brokers: [broker], logLevel: logLevel.NOTHING });
const producer = kafka.producer();
const consumer = kafka.consumer({ groupId: "e2e-js-reader" });
await producer.connect();
await consumer.connect();
await consumer.subscribe({ topic: outTopic, fromBeginning: true });
const sent = [
  { key: "order-1", value: "cancel order 1", headers: { "x-delay": "1500" } },
  { key: "order-2", value: "cancel order 2", headers: { "x-delay": "1s", "x-message-id": "js-2", trace: Buffer.from([0, 1, 2]) } },
  { key: "order-3", value: null, headers: { "x-delay": "1200ms" } },
  { value: "no key", headers: { "X-Delay": "800" } },
];
const str = (b) => (b === null || b === undefined ? null : b.toString("latin1"));
let got = 0;
const t0 = Date.now();
const done = new Promise((resolve) => {
  consumer.run({
    eachMessage: async ({ message }) => {
      const headers = {};
      for (const [k, v] of Object.entries(message.headers || {})) headers[k] = str(v);
      console.log(JSON.stringify({ after: Date.now() - t0, key: str(message.key), value: str(message.value), headers }));
      if (++got === sent.length) resolve();
    },
  });
});
await producer.send({ topic: inTopic, messages: sent });
await done;
await consumer.disconnect();
await producer.disconnect();
