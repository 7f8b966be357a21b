package sinktest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/conformance"
	"github.com/delaybridge/delaybridge/internal/testenv"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// open opens a Sink and closes it at the end of the test.
func (s *suite) open(t *testing.T) sinks.Sink {
	t.Helper()
	sk := s.h.Open(t)
	if sk == nil {
		t.Fatal("Harness.Open returned nil")
	}
	t.Cleanup(func() {
		if err := sk.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return sk
}

// ready asserts the Sink implements sinks.Ready and waits until it reports
// nil.
func (s *suite) ready(t *testing.T, sk sinks.Sink) sinks.Ready {
	t.Helper()
	r, ok := sk.(sinks.Ready)
	if !ok {
		t.Fatalf("%T does not implement sinks.Ready; every adapter must, for /readyz", sk)
	}
	var last error
	if !testenv.Poll(s.h.Timeout, func() bool { last = r.Ready(); return last == nil }) {
		t.Fatalf("Ready() still %v after %v", last, s.h.Timeout)
	}
	return r
}

// msg returns a message to dest with a fresh ID, due now, attempt 1.
func (s *suite) msg(dest string, body []byte, hs envelope.Headers) sinks.Outgoing {
	return sinks.Outgoing{
		Message: &envelope.Message{
			ID:          "sinktest-" + s.run + "-" + itoa(s.seq.Add(1)),
			DueAt:       time.Now().Truncate(time.Millisecond),
			Sink:        "conformance",
			Destination: dest,
			Headers:     hs,
			Body:        body,
			Ingest:      "conformance-in",
			IngestedAt:  time.Now().Add(-time.Second).Truncate(time.Millisecond),
		},
		Attempt: 1,
	}
}

// msgs returns n messages to dest with body "msg <i>".
func (s *suite) msgs(dest string, n int) []sinks.Outgoing {
	out := make([]sinks.Outgoing, n)
	for i := range out {
		out[i] = s.msg(dest, fmt.Appendf(nil, "msg %d", i), nil)
	}
	return out
}

func ids(ms []sinks.Outgoing) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// publish calls Publish with a Timeout deadline and checks that it returned
// one error per message.
func (s *suite) publish(t *testing.T, sk sinks.Sink, ms []sinks.Outgoing) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.h.Timeout)
	defer cancel()
	return checkLen(t, ms, sk.Publish(ctx, ms))
}

func checkLen(t *testing.T, ms []sinks.Outgoing, errs []error) []error {
	t.Helper()
	if len(errs) != len(ms) {
		t.Fatalf("Publish of %d messages returned %d errors; want one per message", len(ms), len(errs))
	}
	return errs
}

// mustPublish publishes and fails the test unless every message succeeded.
func (s *suite) mustPublish(t *testing.T, sk sinks.Sink, ms []sinks.Outgoing) {
	t.Helper()
	failed := 0
	for i, err := range s.publish(t, sk, ms) {
		if err != nil {
			if failed < 5 {
				t.Errorf("Publish: message %d (%s): %v", i, ms[i].ID, err)
			}
			failed++
		}
	}
	if failed > 0 {
		t.Fatalf("Publish: %d of %d messages failed", failed, len(ms))
	}
}

// inbox collects what Consume delivers for one destination.
type inbox struct {
	s     *suite
	dest  string
	ch    <-chan Received
	got   []Received
	count map[string]int // by x-message-id
}

// consume starts consuming dest.
func (s *suite) consume(t *testing.T, dest string) *inbox {
	t.Helper()
	return &inbox{s: s, dest: dest, ch: s.h.Consume(t, dest), count: map[string]int{}}
}

// dest returns a fresh destination and its consumer.
func (s *suite) dest(t *testing.T) (string, *inbox) {
	t.Helper()
	d := s.h.Destination(t, s.key(t))
	return d, s.consume(t, d)
}

func receivedID(t *testing.T, r Received) string {
	t.Helper()
	if n := r.Headers.Count(envelope.HeaderMessageID); n != 1 {
		t.Fatalf("received a message with %d %s headers, want exactly 1 (headers %q)", n, envelope.HeaderMessageID, r.Headers)
	}
	id, _ := r.Headers.Get(envelope.HeaderMessageID)
	return id
}

// await receives until every ID in want arrived, or fails the test after
// Timeout. It returns the first arrival of each.
func (b *inbox) await(t *testing.T, want ...string) map[string]Received {
	t.Helper()
	deadline := time.NewTimer(b.s.h.Timeout)
	defer deadline.Stop()
	first := map[string]Received{}
	for _, r := range b.got {
		id := receivedID(t, r)
		if _, ok := first[id]; !ok {
			first[id] = r
		}
	}
	for {
		var missing []string
		for _, id := range want {
			if b.count[id] == 0 {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 {
			return first
		}
		select {
		case r, ok := <-b.ch:
			if !ok {
				t.Fatalf("Consume(%s) channel closed while %d messages were missing", b.dest, len(missing))
			}
			id := receivedID(t, r)
			b.got = append(b.got, r)
			b.count[id]++
			if _, ok := first[id]; !ok {
				first[id] = r
			}
		case <-deadline.C:
			t.Fatalf("after %v, %d of %d messages never arrived at %s: %s", b.s.h.Timeout, len(missing), len(want), b.dest, conformance.Abbrev(missing))
		}
	}
}

// order returns the IDs of the messages received so far, in arrival order.
func (b *inbox) order(t *testing.T) []string {
	t.Helper()
	out := make([]string, len(b.got))
	for i, r := range b.got {
		out[i] = receivedID(t, r)
	}
	return out
}
