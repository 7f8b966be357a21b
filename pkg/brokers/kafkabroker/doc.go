// Package kafkabroker is delaybridge's Kafka broker, all of it in one place:
// its configuration blocks with their defaults and validation (config.go),
// how to connect (conn.go), the ingest Source (source.go), the Sink
// (sink.go), and Send, which publishes the way an application does (send.go).
// pkg/brokers registers it.
//
// # Ingest
//
// The Source reads delayed messages from a Kafka topic with a
// consumer group, at least once.
//
// Offsets are committed explicitly, never before the record is handled: per
// partition, the committed offset is the lowest one whose record is not yet
// acknowledged with nil, so every record below it is parked (or rejected).
// A crash or a rebalance therefore re-reads from the first unfinished record:
// records may come twice (their position ID "topic/partition/offset" makes
// the second park a no-op), but none is skipped.
//
// The group is driven through kafka-go's ConsumerGroup: every generation
// lists this member's partitions, each fetched by its own kafka.Reader. When
// a generation ends (a member joined or left, the coordinator went away, or
// Close), fetching stops, acknowledgements still outstanding are awaited for
// a short while, then the finished offsets are committed and the partitions
// are given up: acknowledgements arriving later are ignored, because the
// partition may already belong to another member, which re-reads those
// records. The broker fences commits by generation, so a member that lost
// its partitions cannot overwrite the new owner's progress.
//
// Every generation also watches the topic (watcher.go): when its
// partitions are no longer those the group's assignment was made from
// (the topic was deleted, created again, or given partitions), the
// generation ends and the group rebalances. While the topic is missing
// the group keeps one generation with nothing assigned, and Ready says
// why nothing is read; a topic created again is read from its oldest
// record (with StartOffset "last" too, when this Source saw the topic
// missing: every record in it came after), and its offsets are committed
// though they are below the old topic's.
//
// # Sink
//
// The Sink publishes due messages to Kafka topics (the destination
// is the topic) with acks=all: Publish returns once every in-sync replica
// has the record.
//
// One kafka-go Writer serves every topic and every caller: messages of
// concurrent Publish calls for the same partition share produce requests,
// which go out when BatchSize messages are waiting or BatchTimeout after the
// first one (default 1ms, so a lone due message is not held back). Keys are
// partitioned with murmur2, as the Java client does, so a delayed message
// lands in the same partition as an undelayed one with the same key; a
// message without a key goes to a random partition.
//
// Kafka-go has no idempotent producer: a produce request whose answer is
// lost is sent again, so a record may be written twice. Consumers drop the
// duplicate by its x-message-id header.
//
// # Connection
//
// The connection code is what the Kafka ingest, sink and `send` share: the
// configured TLS and SASL as kafka-go wants them, and errors that say what
// to check when the broker refuses them.
package kafkabroker
