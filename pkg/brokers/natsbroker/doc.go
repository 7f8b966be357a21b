// Package natsbroker is delaybridge's NATS broker, all of it in one place:
// its configuration blocks with their defaults and validation (config.go),
// how to connect (conn.go), the ingest Source (source.go), the Sink
// (sink.go), and Send, which publishes the way an application does (send.go).
// pkg/brokers registers it.
//
// # Ingest
//
// The Source reads delayed messages from NATS: a JetStream stream
// through a durable pull consumer (at least once: a message is acked after it
// is parked, and redelivered after AckWait otherwise), or a core NATS subject
// through a queue subscription (at most once: core NATS keeps nothing, so a
// message in flight when delaybridge stops is lost).
//
// # Sink
//
// The Sink publishes due messages to NATS subjects: with JetStream,
// every message is confirmed by the stream's PubAck and carries Nats-Msg-Id
// (the message ID), so JetStream drops a duplicate inside its window; with
// core NATS a publish is only flushed to the server, which is no proof that
// anyone received it.
//
// # Connection
//
// The connection code is what the NATS ingest and sink share: how to connect
// and how to tell whether the connection is up.
package natsbroker
