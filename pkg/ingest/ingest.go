// Package ingest reads delayed messages from brokers and parks them in
// Redis.
//
// Each broker package under pkg/brokers implements Source (natsbroker,
// kafkabroker, rabbitbroker). Pipeline drives one Source: it reads messages, parses their
// headers (envelope.Parse), parks them in batches, and only then
// acknowledges each one to its broker. A message is acknowledged after it is
// parked, kept as dead (rejected), or its cancel was applied; never before.
// A crash before the acknowledgement means the broker delivers the message
// again, and parking an ID that is already parked is a no-op.
package ingest

import (
	"context"
	"errors"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// AckFunc settles one message returned by Source.Read. It must be called
// exactly once per message, and may be called from another goroutine than
// Read, concurrently with Read.
//
// With err == nil the message is done and the broker may forget it (Kafka:
// its offset is committed once every earlier offset of its partition is done
// too; AMQP: basic.ack; JetStream: Ack). With err != nil it was not handled
// and the broker should deliver it again (AMQP: nack with requeue; JetStream:
// Nak; Kafka: the offset is not committed and the partition is re-read from
// its lowest unfinished offset, so later records come again too and park as
// no-ops).
//
// An AckFunc returns an error only when the broker could not be told; the
// message may then be delivered again, which parking tolerates. A
// Progresser's AckFunc also takes ErrInProgress, which settles nothing.
type AckFunc func(ctx context.Context, err error) error

// Source reads messages from one ingest broker.
type Source interface {
	// Read blocks until the next message is available and returns it with
	// the function that settles it. It returns ctx.Err() when ctx ends and
	// ErrClosed after Close. Transient broker failures are handled inside
	// (reconnect with back-off), so an error is final for this Source.
	// Read is called from one goroutine at a time.
	Read(ctx context.Context) (*envelope.Incoming, AckFunc, error)

	// Close stops reading. Messages read but not acknowledged are delivered
	// again by the broker later. Close waits until acknowledgements already
	// given have reached the broker (a final Kafka commit) or ctx ends.
	Close(ctx context.Context) error
}

// ErrClosed is returned by Read after Close.
var ErrClosed = errors.New("ingest: source closed")

// Releaser is implemented by sources that can hand their work back: an
// instance cut off from Redis cannot park what it reads, and another one
// can. Release stops fetching and gives back to the broker every message
// fetched and not yet returned by Read (JetStream: Nak; AMQP: the channel
// closes, which requeues; Kafka: the member leaves its group, whose
// partitions move to the others); Read blocks until Resume fetches again.
// Messages Read returned are the caller's to give back with their AckFunc
// (a Nak or requeue; on Kafka one of a group left is ignored, and the next
// owner reads it again). Both may be called from another goroutine than
// Read; Release twice, or Resume without Release, does nothing.
type Releaser interface {
	Release(ctx context.Context) error
	Resume(ctx context.Context) error
}

// AckConfirmer is implemented by sources whose broker answers nothing to
// an ack (AMQP) and flags a redelivery alike whether the delivery was
// acked and the ack lost, or returned by some other consumer: the store
// remembers each message such a source parks (its content print) as a
// possible re-read until the broker is seen to process its ack. The
// pipeline takes an AckMark before the acks of a batch and calls
// ConfirmAcks with it after them, then has the store forget the marks of
// the messages whose acks went out.
type AckConfirmer interface {
	// AckMark marks the acks given so far.
	AckMark() uint64
	// ConfirmAcks returns once the broker has processed every ack given
	// after mark (nil), or an error when that cannot be known (the
	// channel of one of them closed since).
	ConfirmAcks(ctx context.Context, mark uint64) error
}

// Progresser is implemented by sources whose broker delivers a message
// again when it is not settled within a time (JetStream: the consumer's
// ack_wait). Their AckFunc also takes ErrInProgress, any number of times
// before the call that settles the message: that call settles nothing, it
// tells the broker that the message is still being handled, which starts
// that time again (JetStream: InProgress). The pipeline does so every
// ProgressEvery for the messages it keeps on purpose, those waiting for
// the store's room, so that the broker does not deliver them again
// meanwhile. ProgressEvery returns 0 when the broker has no such time
// (core NATS).
type Progresser interface {
	ProgressEvery() time.Duration
}

// ErrInProgress, given to the AckFunc of a Progresser's message, says that
// the message is still being handled; it does not settle it.
var ErrInProgress = errors.New("ingest: message still being handled")

// Ready is implemented by sources that know whether they are connected.
// Ready returns nil when connected, else an error saying why not.
type Ready interface {
	Ready() error
}

// Publication is one message as a publisher puts it on an ingest's broker
// (`delaybridge send`, the dev quickstart, tests): the argument of every
// broker's Send.
type Publication struct {
	Headers envelope.Headers
	Body    []byte
	Key     []byte // Kafka: the record key
	// Subject is where to publish on NATS; empty means the ingest's own
	// subject with its wildcards filled in.
	Subject string
}
