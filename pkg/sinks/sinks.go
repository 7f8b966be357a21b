// Package sinks publishes due messages to brokers.
//
// Each broker package under pkg/brokers implements Sink (natsbroker,
// kafkabroker, rabbitbroker). The scheduler removes a message from Redis only after its
// Sink confirmed the publish, so delivery is at least once: a crash between
// the confirmation and the removal publishes the message again, with the same
// x-message-id (and the broker's own ID field) so that consumers can drop
// the duplicate.
package sinks

import (
	"context"
	"errors"
	"math"
	"net"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// Outgoing is one message to publish: the parked message and the attempt
// number (x-delaybridge-attempt, from 1).
type Outgoing struct {
	*envelope.Message
	Attempt int
}

// Sink publishes to one broker.
type Sink interface {
	// Publish publishes msgs, each to its Destination, and waits until the
	// broker confirmed every one of them (AMQP publisher confirm, Kafka
	// acks=all, JetStream PubAck; core NATS: the connection was flushed,
	// which is no proof of delivery) or ctx ends. It returns one error per
	// message, nil for a confirmed one; a message whose fate is unknown has
	// an error and will be published again. Wrap an error with Rejected
	// when the broker refused this message (it counts toward max_attempts),
	// with Permanent when trying again cannot help (dead at once), with
	// NotSent when the sink did not send it for a reason that passes (its
	// bound of publishes awaiting an answer full, or ctx ended before the
	// message's turn: sinks.Expired), with Down when its destination
	// refused it for a state that passes while the broker answers; any other
	// error is the sink's (unreachable, disconnected, timed out): the
	// message waits for the sink without counting an attempt. Publish may
	// be called concurrently.
	Publish(ctx context.Context, msgs []Outgoing) []error

	// Close releases the connection. Publish must not be called after it.
	Close() error
}

// Ready is implemented by sinks that know whether they are connected.
// Ready returns nil when connected, else an error saying why not.
type Ready interface {
	Ready() error
}

// Prober is implemented by sinks that can ask their broker, without
// publishing a message, whether it answers now. Probe returns nil when the
// broker answered before ctx ended, else why not. The scheduler asks it
// when a publish timed out while nothing else of the sink was confirmed
// lately, to tell a destination that never answers from a broker that
// does not (docs/operations.md, "A destination that never answers"). It
// may be called concurrently with Publish.
type Prober interface {
	Probe(ctx context.Context) error
}

// Sizer is implemented by sinks whose broker refuses a message over a
// size it states (a Kafka sink's max_message_bytes, a NATS server's
// max_payload). Oversize returns the error Publish would give m for its
// size alone (Permanent, ReasonTooLarge), or nil: it fits with
// PublishGrowth to spare, or the limit is not known now. The daemon asks
// it as a message is taken in, so that a message its sink can never take
// is refused then, not after its delay; it must be cheap for a message far
// below the limit (Within) and may be called concurrently with Publish.
type Sizer interface {
	Oversize(m Outgoing) error
}

// Within reports, without encoding it, whether m surely fits in limit
// bytes on any broker's wire: its body, key, headers and properties, its
// ID twice (x-message-id and a broker's own ID header), withinSlack bytes
// for the rest a sink adds (the headers' names, x-delaybridge-*) and
// withinPerHeader for each header's framing.
// A Sizer encodes only a message it cannot so clear.
func Within(m Outgoing, limit int) bool {
	n := len(m.Body) + len(m.Key) + 2*len(m.ID) + m.Headers.Size() + m.Properties.Size() +
		withinPerHeader*(len(m.Headers)+len(m.Properties)) + withinSlack
	return n <= limit
}

// PublishGrowth is what a message may grow by between the Oversize asked
// as it is taken in (its first attempt and occurrence) and a later
// publish: x-delaybridge-attempt and the occurrence number with more
// digits (the occurrence twice on NATS, in Nats-Msg-Id too), and a
// re-publish's version ID (about 10 bytes).
const PublishGrowth = 48

// withinSlack and withinPerHeader bound what Within does not count: the
// headers a sink adds besides the ID (about 200 bytes with their framing)
// and a header's framing (Kafka: 10 bytes; NATS: 4).
const (
	withinSlack     = 512
	withinPerHeader = 16
)

// marked is a publish error of the class K (one of the kinds below): the
// class says what the scheduler does with the message (Sink's contract),
// and the error reads as the one it wraps.
type marked[K any] struct{ Err error }

func (e *marked[K]) Error() string { return e.Err.Error() }
func (e *marked[K]) Unwrap() error { return e.Err }

// is reports whether err is or wraps an error of the class K.
func is[K any](err error) bool {
	var e *marked[K]
	return errors.As(err, &e)
}

// The classes of marked.
type (
	permanent struct{}
	rejected  struct{}
	again     struct{}
	notSent   struct{}
	down      struct{}
	sent      struct{}
)

// PermanentError marks a publish failure that retrying cannot fix (a
// message the broker can never accept): the message goes dead at once.
type PermanentError = marked[permanent]

// Permanent wraps err as a PermanentError.
func Permanent(err error) error { return &PermanentError{Err: err} }

// IsPermanent reports whether err is or wraps a PermanentError.
func IsPermanent(err error) bool { return is[permanent](err) }

// RejectedError marks a publish that the broker refused for this message:
// unroutable, no stream for the subject, not authorized for that
// destination, a topic that does not exist. It counts toward max_attempts;
// failures the broker does not attribute to the message do not.
type RejectedError = marked[rejected]

// Rejected wraps err as a RejectedError.
func Rejected(err error) error { return &RejectedError{Err: err} }

// IsRejected reports whether err is or wraps a RejectedError.
func IsRejected(err error) bool { return is[rejected](err) }

// AgainError marks a publish whose fate the sink could not decide while
// it was connected: not the sink's fault, and not known yet to be the
// message's (a RabbitMQ close among many that the sink had no time left
// to attribute). The scheduler publishes it again soon, apart, without
// counting an attempt and without holding the sink.
type AgainError = marked[again]

// Again wraps err as an AgainError.
func Again(err error) error { return &AgainError{Err: err} }

// IsAgain reports whether err is or wraps an AgainError.
func IsAgain(err error) bool { return is[again](err) }

// NotSentError marks a message a sink did not send, for no fault of the
// message, its destination or the sink's broker: the sink's own bound of
// publishes awaiting an answer was full (destinations that do not answer
// hold them), or the publish's time ran out before the message's turn. The
// scheduler publishes it again soon, without counting an attempt, without
// holding the sink, without taking it for its destination's stall and,
// since nothing was sent, without marking it as maybe sent (a cancel
// meanwhile is honoured).
type NotSentError = marked[notSent]

// NotSent wraps err as a NotSentError.
func NotSent(err error) error { return &NotSentError{Err: err} }

// IsNotSent reports whether err is or wraps a NotSentError.
func IsNotSent(err error) bool { return is[notSent](err) }

// DownError marks a publish its destination refused, storing nothing, for
// a state of that destination that passes by itself (a JetStream stream
// without its leader) while the sink's broker answers: not the message's
// fault, nor the sink's, whose other destinations go on. The scheduler
// publishes it again later without counting an attempt, without holding
// the sink and without marking it as maybe sent, after about as long
// again as the message has waited (from half a second to 30 s, the
// blocks of a sink down), for as long as the destination is down.
type DownError = marked[down]

// Down wraps err as a DownError.
func Down(err error) error { return &DownError{Err: err} }

// IsDown reports whether err is or wraps a DownError.
func IsDown(err error) bool { return is[down](err) }

// SentError marks a failed publish whose message was sent and whose
// confirmation never came (the connection was lost meanwhile): the broker
// may hold it. It changes nothing of the class (a sink that lost its
// connection is unavailable); the scheduler tells the store, so that a
// cancel does not promise what the broker may already have.
type SentError = marked[sent]

// Sent wraps err as a SentError.
func Sent(err error) error { return &SentError{Err: err} }

// IsSent reports whether err is or wraps a SentError.
func IsSent(err error) bool { return is[sent](err) }

// Unreachable reports whether connecting to a broker failed because
// nothing answered at its address (refused, no route, no such host, no
// answer in time, a connection taken and never answered: a broker hung,
// or a load balancer in front of none), as opposed to a broker that
// answered and refused (credentials, TLS): a sink opened so waits for its
// broker instead of stopping the daemon's start.
func Unreachable(err error) bool {
	var op *net.OpError // a name that does not resolve is one too: net.Dial wraps the resolver's error
	var ne net.Error
	return (errors.As(err, &op) && op.Op == "dial") || (errors.As(err, &ne) && ne.Timeout())
}

// IsUnavailable reports whether a publish failed because the sink could not
// take it (neither Rejected, Permanent, Again, NotSent nor Down): not the
// message's fault.
func IsUnavailable(err error) bool {
	return err != nil && !IsRejected(err) && !IsPermanent(err) && !IsAgain(err) && !IsNotSent(err) && !IsDown(err)
}

// Fill sets every nil entry of errs to err; it returns errs, for the
// "everything failed" path of an adapter.
func Fill(errs []error, err error) []error {
	for i := range errs {
		if errs[i] == nil {
			errs[i] = err
		}
	}
	return errs
}

// Expired is ctx.Err(), or context.DeadlineExceeded once ctx's deadline has
// passed by the clock although its timer has not fired yet: a process
// resumed from a pause runs its goroutines before its timers, so a sink
// that checked ctx.Err() alone went on sending a batch whose time had run
// out during the pause. It is ErrSendBy from the instant WithSendBy set
// on. A sink checks it before each message it sends.
func Expired(ctx context.Context) error {
	if err := Over(ctx); err != nil {
		return err
	}
	if by, ok := ctx.Value(sendByKey{}).(time.Time); ok && !time.Now().Before(by) {
		return ErrSendBy
	}
	return nil
}

// Left is the time until Expired says the caller's time is up: ctx's
// deadline or WithSendBy's bound, whichever comes first (a large
// duration when neither is set). A sink that may wait before it sends
// (for room in its own bound) waits no longer.
func Left(ctx context.Context) time.Duration {
	left := time.Duration(math.MaxInt64)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	if by, ok := ctx.Value(sendByKey{}).(time.Time); ok {
		left = min(left, time.Until(by))
	}
	return left
}

// Over is Expired without WithSendBy's bound: whether the caller's time is
// up, for a message already sent whose confirm did not come.
func Over(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// ErrSendBy is Expired's error from the instant WithSendBy set on: the
// message was not sent, and will not be in this publish.
var ErrSendBy = errors.New("the time to begin sending it was over")

type sendByKey struct{}

type publishTimeoutKey struct{}

// WithPublishTimeout tells a sink being opened the most time the scheduler
// gives one of its publishes (scheduler.publish_timeout), for a sink that
// keeps what it waits for past its Publish's return and must let go of it
// (a NATS sink's PubAcks). The daemon sets it on the context of Open.
func WithPublishTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, publishTimeoutKey{}, d)
}

// PublishTimeout is the time WithPublishTimeout set on ctx, 0 when none.
func PublishTimeout(ctx context.Context) time.Duration {
	d, _ := ctx.Value(publishTimeoutKey{}).(time.Duration)
	return d
}

type apartKey struct{}

// WithApart tells a sink that the messages of this publish go apart from
// the others of their sink: their destinations did not answer within the
// publish timeout lately, while the sink answered (a destination that
// stalls). A sink whose one connection a destination can stop for all (a
// RabbitMQ queue that takes no publish stops the connection that sends to
// it: flow control) publishes them where they hold nobody else up.
func WithApart(ctx context.Context) context.Context {
	return context.WithValue(ctx, apartKey{}, true)
}

// IsApart reports whether WithApart marked ctx.
func IsApart(ctx context.Context) bool {
	apart, _ := ctx.Value(apartKey{}).(bool)
	return apart
}

// WithSendBy bounds when a sink may still begin sending a message of a
// publish: from t on (by the clock) Expired is ErrSendBy, while the
// confirms of what was sent are still awaited until ctx's deadline. The
// scheduler sets it to the lease's fence (scheduler.lease_margin).
func WithSendBy(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, sendByKey{}, t)
}
