package sinks

import (
	"context"
	"log/slog"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// HeaderDeadReason carries the reason on a dead-letter copy.
const HeaderDeadReason = "x-delaybridge-dead-reason"

// DeadLetter publishes a copy of every message that becomes dead to one
// sink and destination (config dead.sink / dead.destination). It is best
// effort: the dead message stays in Redis whatever happens here, so a
// failed copy is logged and counted, not retried. A nil *DeadLetter does
// nothing.
type DeadLetter struct {
	Sink        Sink
	Destination string
	Timeout     time.Duration // bound of one publish (default 5s)
	Logger      *slog.Logger
	// Count, when set, is told how many copies were confirmed and failed.
	Count func(ok, failed int)
}

// Dead is a message that became dead, with its reason and the attempts made.
type Dead struct {
	Message  *envelope.Message
	Reason   string
	Attempts int
}

// Publish sends the copies and waits for the sink (at most Timeout).
func (d *DeadLetter) Publish(ctx context.Context, dead []Dead) {
	if d == nil || len(dead) == 0 {
		return
	}
	out := make([]Outgoing, 0, len(dead))
	for _, x := range dead {
		if x.Message == nil {
			continue // nothing decodable to send
		}
		m := *x.Message
		m.Destination = d.Destination
		m.Headers = append(append(envelope.Headers(nil), x.Message.Headers...), envelope.Header{Key: HeaderDeadReason, Value: x.Reason})
		out = append(out, Outgoing{Message: &m, Attempt: max(x.Attempts, 1)})
	}
	if len(out) == 0 {
		return
	}
	// A sink that says it is not connected cannot confirm a copy: waiting
	// up to Timeout for it would only hold up the caller (an ingest batch,
	// a scheduler shard) and the messages behind it, once per batch, for as
	// long as the dead-letter sink is down.
	if r, ok := d.Sink.(Ready); ok {
		if err := r.Ready(); err != nil {
			if d.Logger != nil {
				d.Logger.Warn("dead-letter sink not ready: copies not published; the dead messages are still kept in redis",
					"copies", len(out), "destination", d.Destination, "err", err)
			}
			if d.Count != nil {
				d.Count(0, len(out))
			}
			return
		}
	}
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var ok, failed int
	for i, err := range d.Sink.Publish(ctx, out) {
		if err == nil {
			ok++
			continue
		}
		failed++
		if d.Logger != nil {
			d.Logger.Warn("dead-letter copy not published; the dead message is still kept in redis",
				"id", out[i].ID, "destination", d.Destination, "err", err)
		}
	}
	if d.Count != nil {
		d.Count(ok, failed)
	}
}
