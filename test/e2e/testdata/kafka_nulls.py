"""Publishes and consumes Kafka records the way librdkafka users do
(python3-confluent-kafka), for TestKafkaNullsRoundTrip.

  kafka_nulls.py produce BROKERS TOPIC
      writes the three records of the test: a null value with a null
      header value, an empty key with an empty value, binary key/value.
  kafka_nulls.py consume BROKERS TOPIC N
      reads N records from the start of TOPIC and prints one JSON line each:
      {"key": hex or null, "value": hex or null, "headers": [[k, hex or null]]}
"""
import json
import sys

from confluent_kafka import Consumer, Producer


def hexornull(b):
    return None if b is None else b.hex()


def produce(brokers, topic):
    # murmur2_random: the partitioner of kafka-go's Hash balancer and Java's
    # default (librdkafka's default is consistent_random).
    p = Producer({"bootstrap.servers": brokers, "partitioner": "murmur2_random", "acks": "all"})
    p.produce(topic, key=b"py-k1", value=None,
              headers=[("x-delay", b"0"), ("x-message-id", b"py-null"), ("h-null", None)])
    p.produce(topic, key=b"", value=b"",
              headers=[("x-delay", b"0"), ("x-message-id", b"py-empty")])
    p.produce(topic, key=b"\x00\xff", value=b"\x00\x01\xfe\xff",
              headers=[("x-delay", b"0"), ("x-message-id", b"py-bin"), ("bin", b"\x00\xff")])
    if p.flush(30) != 0:
        sys.exit("records not delivered")


def consume(brokers, topic, n):
    c = Consumer({"bootstrap.servers": brokers, "group.id": "nulls-check",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got = 0
    while got < n:
        m = c.poll(30)
        if m is None:
            sys.exit("no record within 30 s")
        if m.error():
            continue
        print(json.dumps({"key": hexornull(m.key()), "value": hexornull(m.value()),
                          "headers": [[k, hexornull(v)] for k, v in (m.headers() or [])]}), flush=True)
        got += 1
    c.close()


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        produce(sys.argv[2], sys.argv[3])
    else:
        consume(sys.argv[2], sys.argv[3], int(sys.argv[4]))
