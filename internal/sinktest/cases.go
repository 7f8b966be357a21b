package sinktest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/conformance"
	"github.com/delaybridge/delaybridge/internal/testenv"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// testReady: an open Sink implements sinks.Ready and reports nil.
func (s *suite) testReady(t *testing.T) {
	s.ready(t, s.open(t))
}

// testBody: bodies arrive byte for byte: every byte value, empty, large.
func (s *suite) testBody(t *testing.T) {
	sk := s.open(t)
	dest, in := s.dest(t)
	binary := make([]byte, 512)
	for i := range binary {
		binary[i] = byte(i)
	}
	large := make([]byte, s.h.Features.MaxBody)
	for i := range large {
		large[i] = byte(i*7 + i>>9)
	}
	bodies := [][]byte{binary, nil, []byte(`{"order":42,"note":"héllo ✓"}`), large}
	ms := make([]sinks.Outgoing, len(bodies))
	for i, b := range bodies {
		ms[i] = s.msg(dest, b, nil)
	}
	s.mustPublish(t, sk, ms)
	got := in.await(t, ids(ms)...)
	for i, m := range ms {
		if b := got[m.ID].Body; !bytes.Equal(b, bodies[i]) {
			t.Errorf("body %d: got %d bytes, want %d", i, len(b), len(bodies[i]))
		}
	}
}

// testHeaders: the forwarded headers arrive exactly (key case kept); control
// headers do not; x-message-id, x-delaybridge-due-at and
// x-delaybridge-attempt are set by the sink; the broker's ID field is the
// message ID.
func (s *suite) testHeaders(t *testing.T) {
	sk := s.open(t)
	dest, in := s.dest(t)
	forwarded := envelope.Headers{
		{Key: "X-Mixed-Case", Value: "Value With Spaces"},
		{Key: "content-type", Value: "application/json; charset=utf-8"},
		{Key: "x-utf8", Value: "héllo ✓ 日本"},
		{Key: "x-empty", Value: ""},
		{Key: "traceparent", Value: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
	// What a parked message should no longer carry, and what an older
	// delaybridge hop may have left: none of it may be forwarded as is.
	stale := envelope.Headers{
		{Key: envelope.HeaderDelay, Value: "5s"},
		{Key: "X-Deliver-At", Value: "2026-12-01T10:00:00Z"},
		{Key: envelope.HeaderSink, Value: "other"},
		{Key: envelope.HeaderDestination, Value: "elsewhere"},
		{Key: envelope.HeaderCancel, Value: "victim"},
		{Key: envelope.HeaderPriority, Value: "9"},
		{Key: "X-Message-Id", Value: "stale-id"},
		{Key: envelope.HeaderAttempt, Value: "99"},
		{Key: "X-Delaybridge-Due-At", Value: "1999-01-01T00:00:00.000Z"},
	}
	// An earlier NATS hop's ID: the NATS sink replaces it, the others
	// forward it like any ingest header.
	natsID := envelope.Header{Key: envelope.HeaderNatsMsgID, Value: "earlier-nats-id"}
	stale = append(stale, natsID)
	m := s.msg(dest, []byte("headers"), append(append(envelope.Headers(nil), forwarded...), stale...))
	m.Attempt = 3
	s.mustPublish(t, sk, []sinks.Outgoing{m})
	r := in.await(t, m.ID)[m.ID]

	want := append(append(envelope.Headers(nil), forwarded...),
		envelope.Header{Key: envelope.HeaderMessageID, Value: m.ID},
		envelope.Header{Key: envelope.HeaderDueAt, Value: envelope.FormatTime(m.DueAt)},
		envelope.Header{Key: envelope.HeaderAttempt, Value: "3"},
	)
	if !strings.EqualFold(s.h.Features.BrokerIDHeader, natsID.Key) {
		want = append(want, natsID)
	}
	if d := conformance.DiffHeaders(want, r.Headers); d != "" {
		t.Errorf("headers differ: %s\ngot  %q\nwant %q", d, r.Headers, want)
	}
	if s.h.Features.BrokerID && r.BrokerID != m.ID {
		t.Errorf("broker message ID = %q, want the message ID %q", r.BrokerID, m.ID)
	}
}

// testDuplicateHeaders: every value of a repeated header arrives, in order.
func (s *suite) testDuplicateHeaders(t *testing.T) {
	if !s.h.Features.DuplicateHeaders {
		t.Skip("Features.DuplicateHeaders is false")
	}
	sk := s.open(t)
	dest, in := s.dest(t)
	hs := envelope.Headers{{Key: "x-dup", Value: "first"}, {Key: "x-dup", Value: "second"}, {Key: "x-dup", Value: "third"}}
	m := s.msg(dest, []byte("dup"), hs)
	s.mustPublish(t, sk, []sinks.Outgoing{m})
	r := in.await(t, m.ID)[m.ID]
	if d := conformance.DiffHeaders(m.OutHeaders(1), r.Headers); d != "" {
		t.Errorf("headers differ: %s", d)
	}
}

// testUncarriableHeaders: a header the broker cannot carry exactly fails
// its message alone with a Permanent error; it never arrives altered. With
// BinaryHeaders every value must go through.
func (s *suite) testUncarriableHeaders(t *testing.T) {
	sk := s.open(t)
	dest, in := s.dest(t)
	odd := []struct {
		name       string
		key, value string
		valueOnly  bool // a value case: must succeed with BinaryHeaders
	}{
		{"leading space in value", "x-lead", "  leading", true},
		{"trailing space in value", "x-trail", "trailing \t", true},
		{"CR LF in value", "x-crlf", "a\r\nb", true},
		{"binary value", "x-bin", "\x00\x01\x7f\xfe\xff", true},
		{"space in key", "x key", "v", false},
		{"colon in key", "x:key", "v", false},
		{"non-ASCII key", "x-ü", "v", false},
		{"empty key", "", "v", false},
	}
	ms := make([]sinks.Outgoing, 0, len(odd)+1)
	good := s.msg(dest, []byte("good"), envelope.Headers{{Key: "x-fine", Value: "fine"}})
	ms = append(ms, good)
	for _, o := range odd {
		ms = append(ms, s.msg(dest, []byte(o.name), envelope.Headers{{Key: o.key, Value: o.value}}))
	}
	errs := s.publish(t, sk, ms)
	if errs[0] != nil {
		t.Fatalf("a well-formed message in the same batch failed: %v", errs[0])
	}
	var ok []string
	for i, o := range odd {
		err := errs[i+1]
		switch {
		case err == nil:
			ok = append(ok, ms[i+1].ID)
		case s.h.Features.BinaryHeaders && o.valueOnly:
			t.Errorf("%s: %v; Features.BinaryHeaders promises any value", o.name, err)
		case !sinks.IsPermanent(err):
			t.Errorf("%s: error %v is not Permanent: retrying cannot make the broker carry it", o.name, err)
		default:
			t.Logf("%s: refused, Permanent: %v", o.name, err)
		}
	}
	got := in.await(t, append(ok, good.ID)...)
	for i, o := range odd {
		m := ms[i+1]
		r, arrived := got[m.ID]
		if !arrived {
			continue
		}
		want := m.OutHeaders(1)
		if d := conformance.DiffHeaders(want, r.Headers); d != "" {
			t.Errorf("%s: Publish reported success but the header arrived altered: %s", o.name, d)
		}
	}
}

// testKey: the record key arrives (Keys); without Keys a message with a key
// is still published.
func (s *suite) testKey(t *testing.T) {
	sk := s.open(t)
	dest, in := s.dest(t)
	keyed := s.msg(dest, []byte("keyed"), nil)
	keyed.Key = []byte("key\x00\xff/42")
	unkeyed := s.msg(dest, []byte("unkeyed"), nil)
	s.mustPublish(t, sk, []sinks.Outgoing{keyed, unkeyed})
	got := in.await(t, keyed.ID, unkeyed.ID)
	if !s.h.Features.Keys {
		return
	}
	if k := got[keyed.ID].Key; !bytes.Equal(k, keyed.Key) {
		t.Errorf("key = %q, want %q", k, keyed.Key)
	}
	if k := got[unkeyed.ID].Key; len(k) != 0 {
		t.Errorf("key of a message without key = %q, want none", k)
	}
}

// testBatch: 1000 messages in one Publish are all confirmed and arrive once.
func (s *suite) testBatch(t *testing.T) {
	sk := s.open(t)
	dest, in := s.dest(t)
	ms := s.msgs(dest, 1000)
	s.mustPublish(t, sk, ms)
	in.await(t, ids(ms)...)
	for _, id := range ids(ms) {
		if n := in.count[id]; n > 1 {
			t.Errorf("message %s arrived %d times", id, n)
		}
	}
}

// testPerMessageErrors: one unroutable message fails alone.
func (s *suite) testPerMessageErrors(t *testing.T) {
	if s.h.UnroutableDestination == nil {
		t.Skip("Harness.UnroutableDestination is nil: the broker cannot tell an unroutable message")
	}
	sk := s.open(t)
	dest, in := s.dest(t)
	ms := s.msgs(dest, 5)
	ms[2].Destination = s.h.UnroutableDestination(t)
	errs := s.publish(t, sk, ms)
	if errs[2] == nil {
		t.Errorf("message to the unroutable destination %q: nil error, want an error", ms[2].Destination)
	} else {
		t.Logf("unroutable: %v (permanent: %v)", errs[2], sinks.IsPermanent(errs[2]))
	}
	var okIDs []string
	for i, err := range errs {
		if i == 2 {
			continue
		}
		if err != nil {
			t.Errorf("message %d, routable, failed with the unroutable one: %v", i, err)
		} else {
			okIDs = append(okIDs, ms[i].ID)
		}
	}
	in.await(t, okIDs...)
}

// testOversize: a body the broker refuses fails alone, Permanent.
func (s *suite) testOversize(t *testing.T) {
	if s.h.Features.OversizeBody <= 0 {
		t.Skip("Features.OversizeBody is 0")
	}
	sk := s.open(t)
	dest, in := s.dest(t)
	ms := s.msgs(dest, 3)
	ms[1].Body = make([]byte, s.h.Features.OversizeBody)
	errs := s.publish(t, sk, ms)
	switch err := errs[1]; {
	case err == nil:
		t.Errorf("a body of %d bytes was confirmed; Features.OversizeBody says the broker refuses it", len(ms[1].Body))
	case !sinks.IsPermanent(err):
		t.Errorf("oversized body: error %v is not Permanent: retrying cannot help", err)
	}
	for _, i := range []int{0, 2} {
		if errs[i] != nil {
			t.Errorf("message %d failed with the oversized one: %v", i, errs[i])
		}
	}
	in.await(t, ms[0].ID, ms[2].ID)
}

// testSizer: a sinks.Sizer refuses what Publish refuses for its size, to
// the byte, with sinks.PublishGrowth to spare: to the largest body Oversize
// lets through, Publish takes PublishGrowth bytes more and refuses one
// more than that, Permanent and too_large; a body far below the limit is
// let through without more.
func (s *suite) testSizer(t *testing.T) {
	if s.h.Features.OversizeBody <= 0 {
		t.Skip("Features.OversizeBody is 0: the broker states no size")
	}
	sk := s.open(t)
	sz, ok := sk.(sinks.Sizer)
	if !ok {
		t.Skip("the sink is not a sinks.Sizer")
	}
	dest, in := s.dest(t)
	// One message, its body of every size: a fresh ID for each would grow
	// the message by a digit now and then.
	base := s.msg(dest, nil, envelope.Headers{{Key: "x-app", Value: "v"}})
	withBody := func(n int) sinks.Outgoing {
		m := *base.Message
		m.Body = make([]byte, n)
		return sinks.Outgoing{Message: &m, Attempt: base.Attempt}
	}
	if err := sz.Oversize(withBody(s.h.Features.OversizeBody)); !sinks.IsPermanent(err) || sinks.ReasonOf(err) != sinks.ReasonTooLarge {
		t.Fatalf("Oversize of a body of Features.OversizeBody bytes: %v, want a Permanent too_large error", err)
	}
	if err := sz.Oversize(withBody(1024)); err != nil {
		t.Fatalf("Oversize of a 1 KiB body: %v", err)
	}
	// The largest body that fits, by bisection: Oversize grows with it.
	lo, hi := 1024, s.h.Features.OversizeBody // lo fits, hi does not
	for hi-lo > 1 {
		if mid := (lo + hi) / 2; sz.Oversize(withBody(mid)) == nil {
			lo = mid
		} else {
			hi = mid
		}
	}
	edge := lo + sinks.PublishGrowth
	fits, over := withBody(edge), withBody(edge+1)
	errs := s.publish(t, sk, []sinks.Outgoing{fits, over})
	if errs[0] != nil {
		t.Errorf("a body of %d bytes, PublishGrowth over the largest Oversize lets through: %v", edge, errs[0])
	}
	if !sinks.IsPermanent(errs[1]) || sinks.ReasonOf(errs[1]) != sinks.ReasonTooLarge {
		t.Errorf("a body of %d bytes, one more: Publish gave %v, want a Permanent too_large error", edge+1, errs[1])
	}
	in.await(t, fits.ID)
}

// testConcurrent: several goroutines publish through one Sink at once.
func (s *suite) testConcurrent(t *testing.T) {
	const goroutines, batches, size = 8, 10, 10
	sk := s.open(t)
	dest, in := s.dest(t)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		all  []string
		fail []error
	)
	for range goroutines {
		batch := make([][]sinks.Outgoing, batches)
		for b := range batch {
			batch[b] = s.msgs(dest, size)
			all = append(all, ids(batch[b])...)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, ms := range batch {
				ctx, cancel := context.WithTimeout(context.Background(), s.h.Timeout)
				errs := sk.Publish(ctx, ms)
				cancel()
				mu.Lock()
				if len(errs) != len(ms) {
					fail = append(fail, fmt.Errorf("Publish of %d messages returned %d errors", len(ms), len(errs)))
				}
				for _, err := range errs {
					if err != nil {
						fail = append(fail, err)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for i, err := range fail {
		if i == 5 {
			t.Errorf("... %d errors in all", len(fail))
			break
		}
		t.Errorf("concurrent Publish: %v", err)
	}
	if len(fail) > 0 {
		t.FailNow()
	}
	in.await(t, all...)
}

// testOrdered: successive batches to one destination and key arrive in
// publish order.
func (s *suite) testOrdered(t *testing.T) {
	if !s.h.Features.Ordered {
		t.Skip("Features.Ordered is false")
	}
	sk := s.open(t)
	dest, in := s.dest(t)
	var all []string
	for range 3 {
		ms := s.msgs(dest, 100)
		for i := range ms {
			ms[i].Key = []byte("ordered")
		}
		s.mustPublish(t, sk, ms)
		all = append(all, ids(ms)...)
	}
	in.await(t, all...)
	seen := map[string]bool{}
	var order []string
	for _, id := range in.order(t) {
		if !seen[id] {
			seen[id] = true
			order = append(order, id)
		}
	}
	for i := range all {
		if order[i] != all[i] {
			t.Fatalf("arrival #%d is %s, want %s", i, order[i], all[i])
		}
	}
}

// testDedupe: the same message ID published twice inside the broker's
// window is stored once, and both publishes are confirmed.
func (s *suite) testDedupe(t *testing.T) {
	if !s.h.Features.Dedupe {
		t.Skip("Features.Dedupe is false")
	}
	if !s.h.Features.Ordered {
		t.Fatal("the Dedupe check needs Features.Ordered: a marker published after the duplicate proves it was dropped")
	}
	sk := s.open(t)
	dest, in := s.dest(t)
	m := s.msg(dest, []byte("once"), nil)
	s.mustPublish(t, sk, []sinks.Outgoing{m})
	again := m
	again.Attempt = 2 // a republish after a crash
	s.mustPublish(t, sk, []sinks.Outgoing{again})
	marker := s.msg(dest, []byte("marker"), nil)
	s.mustPublish(t, sk, []sinks.Outgoing{marker})
	got := in.await(t, m.ID, marker.ID)
	if n := in.count[m.ID]; n != 1 {
		t.Errorf("message %s stored %d times, want once (broker dedupe on the message ID)", m.ID, n)
	}
	if a, _ := got[m.ID].Headers.Get(envelope.HeaderAttempt); a != "1" {
		t.Errorf("kept copy has attempt %q, want the first publish (1)", a)
	}
}

// publishWithin runs Publish(ctx) and fails the test if it has not returned
// within limit.
func publishWithin(t *testing.T, sk sinks.Sink, ctx context.Context, ms []sinks.Outgoing, limit time.Duration) []error {
	t.Helper()
	done := make(chan []error, 1)
	go func() { done <- sk.Publish(ctx, ms) }()
	select {
	case errs := <-done:
		return checkLen(t, ms, errs)
	case <-time.After(limit):
		t.Fatalf("Publish did not return within %v", limit)
		return nil
	}
}

// testContext: Publish works without a deadline, and with a context that
// already ended it sends nothing and reports errors, rather than
// panicking or hanging.
func (s *suite) testContext(t *testing.T) {
	sk := s.open(t)
	dest, in := s.dest(t)

	m := s.msg(dest, []byte("no deadline"), nil)
	if err := publishWithin(t, sk, context.Background(), []sinks.Outgoing{m}, s.h.Timeout)[0]; err != nil {
		t.Errorf("Publish with a context without deadline: %v", err)
	} else {
		in.await(t, m.ID)
	}

	// With a context that already ended it sends nothing (a sink sends
	// nothing more once its context has ended: what the scheduler's lease
	// fence counts on) and fails every message; a message published after
	// it arrives, alone.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ms := s.msgs(dest, 20)
	for i, err := range publishWithin(t, sk, ctx, ms, 10*time.Second) {
		if err == nil {
			t.Errorf("message %d reported confirmed with a context that had ended", i)
		}
	}
	after := s.msg(dest, []byte("after the ended context"), nil)
	s.mustPublish(t, sk, []sinks.Outgoing{after})
	in.await(t, after.ID)
	for _, m := range ms {
		if in.count[m.ID] > 0 {
			t.Errorf("%s was sent with a context that had ended", m.ID)
		}
	}
}

// testBrokerRestart: while the broker is down Ready reports it and Publish
// fails (with Confirms) within its deadline; once it is back the same Sink
// publishes again.
func (s *suite) testBrokerRestart(t *testing.T) {
	if s.h.StopBroker == nil {
		t.Skip("Harness.StopBroker is nil: the test cannot restart the broker")
	}
	sk := s.open(t)
	r := s.ready(t, sk)
	dest, in := s.dest(t)
	first := s.msg(dest, []byte("before"), nil)
	s.mustPublish(t, sk, []sinks.Outgoing{first})
	in.await(t, first.ID)

	down := true
	t.Cleanup(func() {
		if down {
			s.h.StartBroker(t)
		}
	})
	s.h.StopBroker(t)
	if !testenv.Poll(s.h.Timeout, func() bool { return r.Ready() != nil }) {
		t.Errorf("Ready() still nil %v after the broker stopped", s.h.Timeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	ms := s.msgs(dest, 5)
	errs := publishWithin(t, sk, ctx, ms, 10*time.Second)
	cancel()
	for i, err := range errs {
		switch {
		case err != nil:
			t.Logf("while down, message %d: %v", i, err)
		case s.h.Features.Confirms:
			t.Errorf("while the broker is down, message %d was reported confirmed", i)
		}
	}

	s.h.StartBroker(t)
	down = false
	s.ready(t, sk)
	dest2, in2 := s.dest(t)
	m := s.msg(dest2, []byte("after"), nil)
	var last error
	if !testenv.Poll(s.h.Timeout, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		last = checkLen(t, []sinks.Outgoing{m}, sk.Publish(ctx, []sinks.Outgoing{m}))[0]
		return last == nil
	}) {
		t.Fatalf("Publish still fails %v after the broker came back: %v", s.h.Timeout, last)
	}
	in2.await(t, m.ID)
}
