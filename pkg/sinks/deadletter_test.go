package sinks_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// downSink is a sink whose broker is unreachable: Ready says so, and a
// publish waits for its context, as a disconnected client does.
type downSink struct{ published int }

func (s *downSink) Publish(ctx context.Context, msgs []sinks.Outgoing) []error {
	s.published += len(msgs)
	<-ctx.Done()
	return sinks.Fill(make([]error, len(msgs)), ctx.Err())
}
func (s *downSink) Close() error { return nil }
func (s *downSink) Ready() error { return errors.New("disconnected") }

// A dead-letter sink that is down costs its caller nothing: the copies are
// counted as failed at once instead of waiting Timeout for a confirmation
// that cannot come (an ingest batch or a scheduler shard would wait that
// long, once per batch, for the whole outage).
func TestDeadLetterSkipsASinkThatIsNotReady(t *testing.T) {
	sink := &downSink{}
	var ok, failed int
	d := &sinks.DeadLetter{Sink: sink, Destination: "dead", Timeout: 10 * time.Second,
		Count: func(o, f int) { ok += o; failed += f }}
	start := time.Now()
	d.Publish(context.Background(), []sinks.Dead{
		{Message: &envelope.Message{ID: "a"}, Reason: "r"},
		{Message: &envelope.Message{ID: "b"}, Reason: "r"},
	})
	if took := time.Since(start); took > time.Second {
		t.Errorf("Publish waited %v for a sink that is not ready", took)
	}
	if sink.published != 0 || ok != 0 || failed != 2 {
		t.Errorf("published %d, counted ok %d failed %d; want 0, 0, 2", sink.published, ok, failed)
	}
}

// refusingSink refuses every message: the destination does not exist.
type refusingSink struct{}

func (refusingSink) Publish(_ context.Context, msgs []sinks.Outgoing) []error {
	return sinks.Fill(make([]error, len(msgs)), sinks.Rejected(sinks.Because(sinks.ReasonNotFound, errors.New("no stream for subject dead"))))
}
func (refusingSink) Close() error { return nil }

// A failed copy speaks up as any failed publish does: counted by its
// reason under the dead-letter sink's name, and logged at WARN with the
// sink, destination and reason at most once per interval, the next line
// saying how many were not.
func TestDeadLetterFailuresAreCountedAndLoggedOncePerInterval(t *testing.T) {
	var logs bytes.Buffer
	counted := map[sinks.Reason]int{}
	d := &sinks.DeadLetter{Sink: refusingSink{}, SinkName: "events", Destination: "dead", Timeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Interval: time.Hour,
		Errors: func(r sinks.Reason, n int) { counted[r] += n }}
	batch := []sinks.Dead{{Message: &envelope.Message{ID: "a"}, Reason: "r"}, {Message: &envelope.Message{ID: "b"}, Reason: "r"}}
	d.Publish(context.Background(), batch)
	d.Publish(context.Background(), batch)
	if counted[sinks.ReasonNotFound] != 4 || len(counted) != 1 {
		t.Errorf("counted %v, want 4 not_found", counted)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "sink=events") ||
		!strings.Contains(lines[0], "destination=dead") || !strings.Contains(lines[0], "reason=not_found") {
		t.Errorf("logged %d lines, want one WARN naming the sink, destination and reason:\n%s", len(lines), logs.String())
	}

	// Interval 0: every failure is logged.
	logs.Reset()
	d = &sinks.DeadLetter{Sink: refusingSink{}, SinkName: "events", Destination: "dead", Timeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	d.Publish(context.Background(), batch)
	if n := strings.Count(logs.String(), "level=WARN"); n != 2 {
		t.Errorf("with no interval, logged %d WARN lines for 2 failed copies:\n%s", n, logs.String())
	}
}

// WithSendBy bounds when a message may begin to be sent: Expired says so
// from that instant (the message is not sent), Over does not (a message
// sent waits for its confirm until the deadline).
func TestSendBy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if err := sinks.Expired(sinks.WithSendBy(ctx, time.Now().Add(time.Hour))); err != nil {
		t.Errorf("before the instant: %v", err)
	}
	past := sinks.WithSendBy(ctx, time.Now().Add(-time.Millisecond))
	if err := sinks.Expired(past); !errors.Is(err, sinks.ErrSendBy) {
		t.Errorf("from the instant: %v, want ErrSendBy", err)
	}
	if err := sinks.Over(past); err != nil {
		t.Errorf("Over from the send-by instant, before the deadline: %v", err)
	}
}

// recordingSink keeps what it is given to publish.
type recordingSink struct{ got []sinks.Outgoing }

func (s *recordingSink) Publish(_ context.Context, msgs []sinks.Outgoing) []error {
	s.got = append(s.got, msgs...)
	return make([]error, len(msgs))
}
func (s *recordingSink) Close() error { return nil }

// A dead letter carries the daemon's reason alone: one the message came
// with (a publisher's forgery, in any case of its name) is left out, where
// the copy carried both, the forged one first, for a consumer that reads
// the first.
func TestDeadLetterCarriesOnlyTheDaemonsReason(t *testing.T) {
	sink := &recordingSink{}
	d := &sinks.DeadLetter{Sink: sink, Destination: "dead", Timeout: time.Second}
	m := &envelope.Message{ID: "a", Headers: envelope.Headers{{Key: "X-Delaybridge-Dead-Reason", Value: "forged"}, {Key: "x-keep", Value: "k"}}}
	d.Publish(context.Background(), []sinks.Dead{{Message: m, Reason: "the real one"}})
	if len(sink.got) != 1 {
		t.Fatalf("published %d copies, want 1", len(sink.got))
	}
	h := sink.got[0].Message.Headers
	if r, _ := h.Get(sinks.HeaderDeadReason); r != "the real one" || h.Count(sinks.HeaderDeadReason) != 1 {
		t.Fatalf("reason %q among %v, want the daemon's alone", r, h)
	}
	if v, _ := h.Get("x-keep"); v != "k" {
		t.Errorf("the message's other headers: %v", h)
	}
	if len(m.Headers) != 2 {
		t.Errorf("the dead message's own headers changed: %v", m.Headers)
	}
}
