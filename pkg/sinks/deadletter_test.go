package sinks_test

import (
	"context"
	"errors"
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
