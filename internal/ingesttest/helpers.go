package ingesttest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/conformance"
	"github.com/delaybridge/delaybridge/internal/testenv"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
)

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// source is an opened Source with what the suite needs around it.
type source struct {
	ingest.Source
	s    *suite
	key  string
	once sync.Once
}

// open opens key and closes the Source at the end of the test (if the test
// did not close it itself).
func (s *suite) open(t *testing.T, key string) *source {
	t.Helper()
	src := s.h.Open(t, key)
	if src == nil {
		t.Fatalf("Harness.Open(%q) returned nil", key)
	}
	o := &source{Source: src, s: s, key: key}
	t.Cleanup(func() { o.close(t) })
	return o
}

// close closes the Source once with a 10s deadline, failing the test when
// Close fails.
func (o *source) close(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	o.closeCtx(t, ctx)
}

// closeCtx closes the Source once with ctx, failing the test when Close
// fails or has not returned after 20s.
func (o *source) closeCtx(t *testing.T, ctx context.Context) {
	t.Helper()
	o.once.Do(func() {
		done := make(chan error, 1)
		go func() { done <- o.Source.Close(ctx) }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Close: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("Close did not return within 20s")
		}
	})
}

// send publishes m to the key with a fresh IDHeader and returns that ID.
func (s *suite) send(t *testing.T, key string, m Message) string {
	t.Helper()
	id := itoa(s.seq.Add(1))
	m.Headers = append(envelope.Headers{{Key: IDHeader, Value: id}}, m.Headers...)
	s.h.Publish(t, key, m)
	return id
}

// sendN publishes n messages with body "msg <i>" and the given key, and
// returns their IDs in publish order.
func (s *suite) sendN(t *testing.T, key string, n int, msgKey []byte) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = s.send(t, key, s.plain(fmt.Sprintf("msg %d", i), msgKey))
	}
	return ids
}

// plain is a message with only a body (and the key when the broker has keys).
func (s *suite) plain(body string, key []byte) Message {
	m := Message{Body: []byte(body)}
	if s.h.Features.Keys {
		m.Key = key
	}
	return m
}

// delivery is one message returned by Read.
type delivery struct {
	in  *envelope.Incoming
	ack ingest.AckFunc
	id  string // IDHeader
}

// read returns the next message, or false when none came within d. Any
// other Read error fails the test.
func (o *source) read(t *testing.T, d time.Duration) (delivery, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	in, ack, err := o.Read(ctx)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return delivery{}, false
		}
		t.Fatalf("Read: %v", err)
	}
	if in == nil || ack == nil {
		t.Fatalf("Read returned a nil message or AckFunc without an error")
	}
	id, ok := in.Headers.Get(IDHeader)
	if !ok {
		t.Fatalf("Read returned a message without the %s header the suite published with every message (headers %q)", IDHeader, in.Headers)
	}
	return delivery{in: in, ack: ack, id: id}, true
}

// next returns the next message or fails the test after d.
func (o *source) next(t *testing.T, d time.Duration, what string) delivery {
	t.Helper()
	m, ok := o.read(t, d)
	if !ok {
		t.Fatalf("no message within %v: waited for %s", d, what)
	}
	return m
}

// settle calls the AckFunc and fails the test when it fails.
func settle(t *testing.T, m delivery, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if aerr := m.ack(ctx, err); aerr != nil {
		t.Fatalf("AckFunc(%v) of message %s: %v", err, m.id, aerr)
	}
}

// tally counts deliveries per ID.
type tally map[string]int

func (c tally) has(ids ...string) bool {
	for _, id := range ids {
		if c[id] == 0 {
			return false
		}
	}
	return true
}

func (c tally) missing(ids []string) []string {
	var out []string
	for _, id := range ids {
		if c[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}

// collect reads and acknowledges every message until every ID of want has
// been read, or fails the test after d. It returns how often each ID came
// and the first delivery of each.
func (o *source) collect(t *testing.T, d time.Duration, want []string) (tally, map[string]delivery) {
	t.Helper()
	seen, first := tally{}, map[string]delivery{}
	deadline := time.Now().Add(d)
	for !seen.has(want...) {
		left := time.Until(deadline)
		m, ok := o.read(t, max(left, time.Millisecond))
		if !ok {
			t.Fatalf("after %v, %d of %d expected messages never came: %s", d, len(seen.missing(want)), len(want), conformance.Abbrev(seen.missing(want)))
		}
		seen[m.id]++
		if _, ok := first[m.id]; !ok {
			first[m.id] = m
		}
		settle(t, m, nil)
	}
	return seen, first
}

// readFor reads for all of d (it always waits that long), acknowledging every
// message that comes, and returns how often each ID came.
func (o *source) readFor(t *testing.T, d time.Duration) tally {
	t.Helper()
	seen := tally{}
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return seen
		}
		m, ok := o.read(t, left)
		if !ok {
			return seen
		}
		seen[m.id]++
		settle(t, m, nil)
	}
}

// redeliveryWait is how long to wait for a redelivery after a reopen.
func (s *suite) redeliveryWait() time.Duration { return s.h.RedeliveryDelay + s.h.Timeout }

// absenceWindow is how long to watch to prove that something is not
// delivered again, once a redelivery of something else was seen.
func (s *suite) absenceWindow() time.Duration { return 500 * time.Millisecond }

// ready asserts the Source implements ingest.Ready and waits until it
// reports nil.
func ready(t *testing.T, src ingest.Source, d time.Duration) ingest.Ready {
	t.Helper()
	r, ok := src.(ingest.Ready)
	if !ok {
		t.Fatalf("%T does not implement ingest.Ready; every adapter must, for /readyz", src)
	}
	var last error
	if !testenv.Poll(d, func() bool { last = r.Ready(); return last == nil }) {
		t.Fatalf("Ready() still %v after %v", last, d)
	}
	return r
}
