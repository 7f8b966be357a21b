package sinks

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/logrepeat"
)

// HeaderDeadReason carries the reason on a dead-letter copy.
const HeaderDeadReason = "x-delaybridge-dead-reason"

// DeadLetter publishes a copy of every message that becomes dead to one
// sink and destination (config dead.sink / dead.destination). It is best
// effort: the dead message stays in Redis whatever happens here, so a
// failed copy is logged and counted, not retried: like any failed publish,
// at WARN with the sink, destination and reason at most once per Interval
// (the next line says how many were not logged), and counted by reason in
// Errors. A nil *DeadLetter does nothing.
type DeadLetter struct {
	Sink        Sink
	SinkName    string // Sink's name, in the log lines and Errors
	Destination string
	Timeout     time.Duration // bound of one publish (default 5s)
	Logger      *slog.Logger
	// Interval is log.repeat_interval; 0 logs every failure.
	Interval time.Duration
	// Count, when set, is told how many copies were confirmed and failed.
	Count func(ok, failed int)
	// Errors, when set, is told the failed copies by reason
	// (delaybridge_sink_publish_errors_total{sink,reason}).
	Errors func(reason Reason, n int)

	once sync.Once
	lim  *logrepeat.Limiter[struct{}]
}

// failed counts the copies that failed with err and logs it, at most once
// per Interval per kind of line.
func (d *DeadLetter) failed(msg string, n int, err error, args ...any) {
	reason := ReasonOf(err)
	if d.Errors != nil {
		d.Errors(reason, n)
	}
	if d.Logger == nil {
		return
	}
	d.once.Do(func() { d.lim = logrepeat.New[struct{}](d.Interval, 2) })
	ok, quiet := d.lim.Allow(msg, time.Now(), struct{}{})
	if !ok {
		return
	}
	args = append([]any{"sink", d.SinkName, "destination", d.Destination, "reason", string(reason), "copies", n}, args...)
	if quiet > 0 {
		args = append(args, "not_logged", quiet)
	}
	d.Logger.Warn(msg, append(args, "err", err)...)
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
		// The reason is the daemon's: one the message carried (a
		// publisher's, or an earlier death's) is left out.
		m.Headers = make(envelope.Headers, 0, len(x.Message.Headers)+1)
		for _, h := range x.Message.Headers {
			if !strings.EqualFold(h.Key, HeaderDeadReason) {
				m.Headers = append(m.Headers, h)
			}
		}
		m.Headers = append(m.Headers, envelope.Header{Key: HeaderDeadReason, Value: x.Reason})
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
			d.failed("dead-letter sink not ready: copies not published; the dead messages are still kept in redis",
				len(out), Because(ReasonUnavailable, err))
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
		d.failed("dead-letter copy not published; the dead message is still kept in redis", 1, err, "id", out[i].ID)
	}
	if d.Count != nil {
		d.Count(ok, failed)
	}
}
