// Package rabbitbroker is delaybridge's RabbitMQ broker, all of it in one place:
// its configuration blocks with their defaults and validation (config.go),
// how to connect (conn.go), the ingest Source (source.go), the Sink
// (sink.go), and Send, which publishes the way an application does (send.go).
// pkg/brokers registers it.
//
// # Ingest
//
// The Source reads delayed messages from a RabbitMQ queue.
//
// The queue is consumed with manual acknowledgements, at least once: a
// message is acked (basic.ack) only when the pipeline acknowledges it after it is
// parked, and nacked with requeue when parking failed. A message read but not
// acknowledged when the connection drops or the Source closes is requeued by the
// broker and delivered again.
//
// Headers and properties: every header keeps its string form (Value, which
// Kafka and NATS sinks publish) and, unless it is a string, its AMQP type in
// the native encoding (native.go, Header.Native); the basic properties the
// delayed-exchange plugin kept go into Incoming.Properties (properties.go).
//
// The Source reconnects by itself with back-off when the broker restarts or
// drops the connection. Delivery tags belong to the channel that delivered
// them, so settling a message whose channel has died since sends nothing: the
// AckFunc returns an error saying that the broker delivers the message again
// (it has already requeued it), and never acks an unrelated message on the
// new channel.
//
// # Sink
//
// The Sink publishes due messages to a RabbitMQ exchange.
//
// Every message is published persistent, with the message ID as the AMQP
// message_id property and the x-message-id, x-delaybridge-due-at and
// x-delaybridge-attempt headers (plus the forwarded ones, with their AMQP
// types when they came from a RabbitMQ ingest) and the kept properties
// (user_id only when it is the sink's own user, as RabbitMQ insists), on a
// channel in publisher-confirm mode. Publish sends a whole batch and then awaits the
// confirms, many in flight; a message counts as published only when the
// broker acked it. With Mandatory, a message the exchange cannot route to
// any queue is returned by the broker (312 NO_ROUTE) and fails with an
// "unroutable" error even though its confirm is an ack.
//
// The Sink keeps a small pool of channels on one connection and reconnects
// with back-off when the broker restarts or drops the connection; a channel
// the broker closes (a missing exchange: 404 NOT_FOUND) is reopened on the
// same connection, and the sink is not ready until the exchange exists. Publishes whose confirm is lost with a channel fail, and
// the scheduler publishes them again (consumers drop duplicates by ID).
//
// A close the broker sends for a publish (541 INTERNAL_ERROR for a routing
// key amq.rabbitmq.reply-to.* that names no live consumer, 406 for an
// expiration that is not a number) is that message's fault: the publishes
// it cut off are published again apart, on a connection of their own,
// halving the group the broker closes again down to the message that does
// it, which fails Rejected (an attempt); the others are confirmed as if
// nothing happened, and the sink reconnects at once without being down
// (quarantine.go).
//
// A queue that takes no publish (a quorum queue without its quorum) makes
// the broker stop reading the connection that sends to it (flow control),
// every publish on it waiting: the sink then connects again at once,
// publishes a destination that stalled on a connection of its own, and
// probes the broker on another that publishes nothing (lanes.go).
//
// # Connection
//
// The connection code is what the RabbitMQ ingest and sink share: dialing
// with TLS and authentication (DialConfig) and errors that say what to
// check, the reconnect back-off, the connection state behind Ready, and the
// classification of AMQP errors.
//
// amqp091-go does not reconnect by itself (its experimental Recovery is left
// off): each adapter runs its own loop that dials, sets up its channels,
// watches NotifyClose, and dials again with lifecycle.Backoff when the broker
// goes away.
package rabbitbroker
