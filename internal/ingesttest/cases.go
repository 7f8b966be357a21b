package ingesttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/conformance"
	"github.com/delaybridge/delaybridge/internal/testenv"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
)

// errNack is what the suite passes to an AckFunc to ask for a redelivery.
var errNack = errors.New("ingesttest: not handled, deliver again")

// testReady: an open Source implements ingest.Ready and reports nil.
func (s *suite) testReady(t *testing.T) {
	src := s.open(t, s.key(t))
	ready(t, src.Source, s.h.Timeout)
}

// testBody: bodies arrive byte for byte: every byte value, empty, large.
func (s *suite) testBody(t *testing.T) {
	key := s.key(t)
	src := s.open(t, key)
	binary := make([]byte, 512)
	for i := range binary {
		binary[i] = byte(i)
	}
	large := make([]byte, s.h.Features.MaxBody)
	for i := range large {
		large[i] = byte(i*7 + i>>9)
	}
	bodies := []struct {
		name string
		body []byte
	}{
		{"every byte value", binary},
		{"empty", nil},
		{"text", []byte(`{"order":42,"note":"héllo ✓"}`)},
		{fmt.Sprintf("%d bytes", len(large)), large},
	}
	ids := make([]string, len(bodies))
	for i, b := range bodies {
		ids[i] = s.send(t, key, Message{Body: b.body})
	}
	_, first := src.collect(t, s.h.Timeout, ids)
	for i, b := range bodies {
		got := first[ids[i]].in.Body
		if !bytes.Equal(got, b.body) {
			t.Errorf("body %s: got %d bytes, want %d; first difference at byte %d", b.name, len(got), len(b.body), firstDiff(got, b.body))
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// testHeaders: headers arrive with their exact key (case kept), value and,
// where the broker allows, duplicates and binary values. Control headers
// are delivered like any other: interpreting them is the pipeline's job.
func (s *suite) testHeaders(t *testing.T) {
	key := s.key(t)
	src := s.open(t, key)
	f := s.h.Features
	hs := envelope.Headers{
		{Key: "X-Mixed-Case", Value: "Value With Spaces"},
		{Key: "content-type", Value: "application/json; charset=utf-8"},
		{Key: "x-utf8", Value: "héllo ✓ 日本"},
		{Key: "x-empty", Value: ""},
		{Key: "x-twice-case", Value: "lower"},
		{Key: "X-Twice-Case", Value: "upper"},
		{Key: envelope.HeaderDelay, Value: "5s"},
		{Key: envelope.HeaderMessageID, Value: "order-42"},
		{Key: "X-Delay-Destination", Value: "orders.expired"},
	}
	if f.DuplicateHeaders {
		hs = append(hs, envelope.Header{Key: "x-dup", Value: "first"}, envelope.Header{Key: "x-dup", Value: "second"})
	}
	if f.BinaryHeaders {
		hs = append(hs,
			envelope.Header{Key: "x-binary", Value: "\x00\x01\r\n\x7f\xfe\xff"},
			envelope.Header{Key: "x-padded", Value: "  padded\t "},
		)
	}
	id := s.send(t, key, Message{Headers: hs, Body: []byte("headers")})
	_, first := src.collect(t, s.h.Timeout, []string{id})
	got := first[id].in.Headers
	if d := conformance.DiffHeaders(hs, got, IDHeader); d != "" {
		t.Errorf("headers differ: %s\ngot  %q\nwant %q", d, got, hs)
	}
	if v, ok := got.Get("x-mixed-case"); !ok || v != "Value With Spaces" {
		t.Errorf("case-insensitive Get(x-mixed-case) = %q, %v", v, ok)
	}
}

// testKey: the record key arrives (Keys), else Incoming.Key is nil.
func (s *suite) testKey(t *testing.T) {
	key := s.key(t)
	src := s.open(t, key)
	if !s.h.Features.Keys {
		id := s.send(t, key, Message{Body: []byte("no key")})
		_, first := src.collect(t, s.h.Timeout, []string{id})
		if k := first[id].in.Key; k != nil {
			t.Errorf("Incoming.Key = %q, want nil: Features.Keys is false", k)
		}
		return
	}
	withKey := []byte("key\x00\xff/42")
	a := s.send(t, key, Message{Body: []byte("keyed"), Key: withKey})
	b := s.send(t, key, Message{Body: []byte("unkeyed")})
	_, first := src.collect(t, s.h.Timeout, []string{a, b})
	if k := first[a].in.Key; !bytes.Equal(k, withKey) {
		t.Errorf("Incoming.Key = %q, want %q", k, withKey)
	}
	if k := first[b].in.Key; k != nil {
		t.Errorf("Incoming.Key of a record without key = %#v, want nil (an empty key would be produced as an empty key, not as none)", k)
	}
}

// testNativeID: the broker's own message ID property reaches
// Incoming.NativeID (and nothing else does).
func (s *suite) testNativeID(t *testing.T) {
	key := s.key(t)
	src := s.open(t, key)
	prop := s.h.Features.NativeID
	if prop == "" {
		id := s.send(t, key, Message{Body: []byte("x")})
		_, first := src.collect(t, s.h.Timeout, []string{id})
		if n := first[id].in.NativeID; n != "" {
			t.Errorf("Incoming.NativeID = %q, want \"\": Features.NativeID is empty", n)
		}
		return
	}
	native := "native-" + s.run + "-" + s.key(t)
	a := s.send(t, key, Message{Body: []byte("with id"), NativeID: native})
	b := s.send(t, key, Message{Body: []byte("without id")})
	_, first := src.collect(t, s.h.Timeout, []string{a, b})
	if n := first[a].in.NativeID; n != native {
		t.Errorf("Incoming.NativeID = %q, want %q (the %s property)", n, native, prop)
	}
	if n := first[b].in.NativeID; n != "" {
		t.Errorf("Incoming.NativeID of a message without %s = %q, want \"\"", prop, n)
	}
}

// testPublishedAt: PublishedAt is the publish time (PublishedAt), else zero.
func (s *suite) testPublishedAt(t *testing.T) {
	key := s.key(t)
	src := s.open(t, key)
	t0 := time.Now()
	id := s.send(t, key, Message{Body: []byte("when")})
	t1 := time.Now()
	_, first := src.collect(t, s.h.Timeout, []string{id})
	p := first[id].in.PublishedAt
	if !s.h.Features.PublishedAt {
		if !p.IsZero() {
			t.Errorf("Incoming.PublishedAt = %v, want zero: Features.PublishedAt is false (the delay would count from an imprecise time)", p)
		}
		return
	}
	const slack = time.Second // clock granularity of the broker; all runs on one host
	if p.Before(t0.Add(-slack)) || p.After(t1.Add(slack)) {
		t.Errorf("Incoming.PublishedAt = %v, want between %v and %v (publish call ±%v)", p, t0, t1, slack)
	}
}

// testSourceAndTombstone: Incoming.Source is the message's own name in its
// broker; Incoming.Tombstone marks a message without a body where the broker
// has such a thing (a Kafka null value), and nothing else.
func (s *suite) testSourceAndTombstone(t *testing.T) {
	key := s.key(t)
	src := s.open(t, key)
	withBody := s.send(t, key, s.plain("named", []byte("k")))
	noBody := s.plain("", []byte("k"))
	noBody.Body = nil
	without := s.send(t, key, noBody)
	_, first := src.collect(t, s.h.Timeout, []string{withBody, without})
	want := s.h.SourceName(key)
	for _, id := range []string{withBody, without} {
		if got := first[id].in.Source; got != want {
			t.Errorf("Incoming.Source = %q, want %q", got, want)
		}
	}
	if first[withBody].in.Tombstone {
		t.Errorf("a message with a body has Incoming.Tombstone set")
	}
	if tomb := first[without].in.Tombstone; tomb != s.h.Features.Tombstones {
		t.Errorf("Incoming.Tombstone of a message without a body = %v, want %v (Features.Tombstones)", tomb, s.h.Features.Tombstones)
	}
}

// testOrigin: Incoming.Origin tells the messages apart and stays the same
// across a redelivery, and Incoming.Redelivered says a redelivery is one
// (Features.Origin).
func (s *suite) testOrigin(t *testing.T) {
	key := s.key(t)
	src := s.open(t, key)
	f := s.h.Features
	ids := s.sendN(t, key, 3, []byte("position"))
	got := s.readDistinct(t, src, ids)
	mark := func(o envelope.Origin) string {
		switch f.Origin {
		case OriginLog:
			if o.Print != 0 || o.Log == "" {
				t.Fatalf("Origin %+v: want a Log and no Print (OriginLog)", o)
			}
			return o.PositionID()
		case OriginPrint:
			if o.Log != "" || o.Pos != 0 || o.Print == 0 {
				t.Fatalf("Origin %+v: want a Print and no Log (OriginPrint)", o)
			}
			return fmt.Sprint(o.Print)
		}
		if o != (envelope.Origin{}) {
			t.Fatalf("Origin %+v: want none (OriginNone)", o)
		}
		return ""
	}
	pos := map[string]string{}
	for _, id := range ids {
		if got[id].in.Redelivered {
			t.Errorf("message %s: Redelivered at its first delivery", id)
		}
		p := mark(got[id].in.Origin)
		if f.Origin == OriginNone {
			settle(t, got[id], nil)
			continue
		}
		if other, dup := pos[p]; dup && f.Origin == OriginLog {
			t.Fatalf("messages %s and %s share the position %q", other, id, p)
		}
		pos[p] = id
	}
	if f.Origin == OriginNone {
		return
	}
	settle(t, got[ids[0]], nil)
	settle(t, got[ids[2]], nil)
	want := got[ids[1]].in.Origin
	var again delivery
	switch {
	case f.Nack:
		settle(t, got[ids[1]], errNack)
		_, first := src.collect(t, s.h.Timeout, ids[1:2])
		again = first[ids[1]]
	case f.AtLeastOnce:
		src.close(t)
		src2 := s.open(t, key)
		_, first := src2.collect(t, s.redeliveryWait(), ids[1:2])
		again = first[ids[1]]
	default:
		t.Skip("neither Features.Nack nor Features.AtLeastOnce: nothing is delivered again")
	}
	if o := again.in.Origin; o != want {
		t.Errorf("Origin of the redelivered message %s = %+v, want %+v as at its first delivery", ids[1], o, want)
	}
	if f.Origin == OriginPrint && !again.in.Redelivered {
		t.Errorf("the redelivered message %s has Redelivered false", ids[1])
	}
}

// readDistinct reads until every ID of ids came once, without settling
// anything, and fails on a message delivered twice meanwhile.
func (s *suite) readDistinct(t *testing.T, src *source, ids []string) map[string]delivery {
	t.Helper()
	got := map[string]delivery{}
	for len(got) < len(ids) {
		m := src.next(t, s.h.Timeout, fmt.Sprintf("%d messages, have %d", len(ids), len(got)))
		if _, dup := got[m.id]; dup {
			t.Fatalf("message %s delivered twice before any was settled (RedeliveryDelay/AckWait too short for the test?)", m.id)
		}
		got[m.id] = m
	}
	return got
}

// testAckOnlyAfterSuccess: what was not acknowledged is delivered again
// after Close and Open; what was acknowledged is not.
func (s *suite) testAckOnlyAfterSuccess(t *testing.T) {
	if !s.h.Features.AtLeastOnce {
		t.Skip("Features.AtLeastOnce is false: the broker keeps nothing to deliver again")
	}
	key := s.key(t)
	src := s.open(t, key)
	ids := s.sendN(t, key, 10, []byte("one-partition"))
	got := s.readDistinct(t, src, ids)
	var acked, unacked []string
	for i, id := range ids {
		ack := i < 5 // Kafka commits a prefix of the partition
		if s.h.Features.AckIndividually {
			ack = i%2 == 0 // per-message acks: a gap must not matter
		}
		if ack {
			settle(t, got[id], nil)
			acked = append(acked, id)
		} else {
			unacked = append(unacked, id)
		}
	}
	src.close(t)

	src2 := s.open(t, key)
	seen, _ := src2.collect(t, s.redeliveryWait(), unacked)
	for id, n := range src2.readFor(t, s.absenceWindow()) {
		seen[id] += n
	}
	for _, id := range acked {
		if seen[id] > 0 {
			t.Errorf("acknowledged message %s was delivered again after Close and Open (ack lost, or not flushed by Close?)", id)
		}
	}
}

// testNack: AckFunc(err) brings the message back: to the open Source (Nack),
// else after Close and Open; the messages acknowledged around it stay done.
func (s *suite) testNack(t *testing.T) {
	key := s.key(t)
	src := s.open(t, key)
	f := s.h.Features
	if !f.AtLeastOnce {
		id := s.send(t, key, Message{Body: []byte("nack")})
		m := src.next(t, s.h.Timeout, "the message")
		if m.id != id {
			t.Fatalf("got message %s, want %s", m.id, id)
		}
		settle(t, m, errNack) // must not fail: there is nothing to tell the broker
		t.Skip("Features.AtLeastOnce is false: a nacked message is not delivered again")
	}
	ids := s.sendN(t, key, 3, []byte("nack"))
	got := s.readDistinct(t, src, ids)
	settle(t, got[ids[0]], nil)
	settle(t, got[ids[1]], errNack)
	settle(t, got[ids[2]], nil)
	var seen tally
	if f.Nack {
		seen, _ = src.collect(t, s.h.Timeout, ids[1:2])
		for id, n := range src.readFor(t, s.absenceWindow()) {
			seen[id] += n
		}
	} else {
		src.close(t)
		src2 := s.open(t, key)
		seen, _ = src2.collect(t, s.redeliveryWait(), ids[1:2])
		for id, n := range src2.readFor(t, s.absenceWindow()) {
			seen[id] += n
		}
	}
	if seen[ids[0]] > 0 {
		t.Errorf("message %s, acknowledged before the nacked one, was delivered again", ids[0])
	}
	if f.AckIndividually && seen[ids[2]] > 0 {
		t.Errorf("message %s, acknowledged after the nacked one, was delivered again (Features.AckIndividually)", ids[2])
	}
}

// testOrdered: messages of one key are read in publish order.
func (s *suite) testOrdered(t *testing.T) {
	if !s.h.Features.Ordered {
		t.Skip("Features.Ordered is false")
	}
	key := s.key(t)
	src := s.open(t, key)
	ids := s.sendN(t, key, 200, []byte("ordered"))
	index := map[string]int{}
	for i, id := range ids {
		index[id] = i
	}
	var order []int
	seen := tally{}
	for len(order) < len(ids) {
		m := src.next(t, s.h.Timeout, fmt.Sprintf("message %d of %d", len(order)+1, len(ids)))
		if seen[m.id] == 0 {
			order = append(order, index[m.id])
		}
		seen[m.id]++
		settle(t, m, nil)
	}
	for i, n := range order {
		if n != i {
			t.Fatalf("read #%d is message #%d of the publish order (want #%d); first reads: %v", i, n, i, order[:min(len(order), i+5)])
		}
	}
}

// testConcurrentAcks: many messages read while earlier ones are acknowledged
// out of order from other goroutines: none lost, none delivered twice, and
// after Close and Open none comes back.
func (s *suite) testConcurrentAcks(t *testing.T) {
	const n, batch, workers = 500, 25, 5
	key := s.key(t)
	src := s.open(t, key)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = s.send(t, key, s.plain(fmt.Sprintf("concurrent %d", i), fmt.Appendf(nil, "key-%d", i%5)))
	}
	// The canary is read but never acknowledged: when it comes back after
	// the reopen, the broker has redelivered what it was going to.
	canary := ""
	if s.h.Features.AtLeastOnce {
		canary = s.send(t, key, s.plain("canary", []byte("canary")))
	}

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		ackErrs []error
	)
	ackAll := func(ms []delivery) {
		rand.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < len(ms); i += workers {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					err := ms[i].ack(ctx, nil)
					cancel()
					if err != nil {
						mu.Lock()
						ackErrs = append(ackErrs, fmt.Errorf("ack %s: %w", ms[i].id, err))
						mu.Unlock()
					}
				}
			}()
		}
	}
	seen := tally{}
	var pending []delivery
	for !seen.has(ids...) || (canary != "" && seen[canary] == 0) {
		m := src.next(t, s.h.Timeout, fmt.Sprintf("%d messages still missing", len(seen.missing(ids))))
		seen[m.id]++
		if m.id == canary {
			continue
		}
		pending = append(pending, m)
		if len(pending) == batch {
			ackAll(pending)
			pending = nil
		}
	}
	ackAll(pending)
	wg.Wait()
	for _, err := range ackErrs {
		t.Error(err)
	}
	for _, id := range ids {
		if seen[id] > 1 {
			t.Errorf("message %s delivered %d times though nothing failed", id, seen[id])
		}
	}
	if canary == "" {
		return
	}
	// Without a deadline: Close must still deliver the acks given above
	// (the contract does not ask callers for one).
	src.closeCtx(t, context.Background())
	src2 := s.open(t, key)
	again, _ := src2.collect(t, s.redeliveryWait(), []string{canary})
	for id, k := range src2.readFor(t, s.absenceWindow()) {
		again[id] += k
	}
	var back []string
	for _, id := range ids {
		if again[id] > 0 {
			back = append(back, id)
		}
	}
	if len(back) > 0 {
		t.Errorf("%d acknowledged messages came back after Close and Open (acks lost, or not flushed by Close?): %s", len(back), conformance.Abbrev(back))
	}
}

// testBacklog: a burst published before anything is read, larger than the
// Source keeps in flight, is read without Read failing: all of it when
// AtLeastOnce, else (drops allowed) until a message published afterwards.
func (s *suite) testBacklog(t *testing.T) {
	key := s.key(t)
	src := s.open(t, key)
	ready(t, src.Source, s.h.Timeout)
	ids := make([]string, s.h.Backlog)
	for i := range ids {
		ids[i] = s.send(t, key, s.plain(fmt.Sprintf("backlog %d", i), []byte("backlog")))
	}
	if s.h.Features.AtLeastOnce {
		src.collect(t, s.h.Timeout, ids)
		return
	}
	// At most once: the client may drop part of the burst, but Read must
	// go on (a dropped message is not an error of the Source). Read what
	// was kept until the last message or a pause of a second, then one
	// message published afterwards must arrive.
	last, read := ids[len(ids)-1], 0
	for {
		m, ok := src.read(t, time.Second)
		if !ok {
			break
		}
		read++
		settle(t, m, nil)
		if m.id == last {
			break
		}
	}
	after := s.send(t, key, Message{Body: []byte("after the backlog")})
	src.collect(t, s.h.Timeout, []string{after})
	t.Logf("at most once: %d of %d backlog messages read", read, len(ids))
}

// readWithin runs Read(ctx) and fails the test if it has not returned
// within limit.
func readWithin(t *testing.T, src ingest.Source, ctx context.Context, limit time.Duration) (*envelope.Incoming, ingest.AckFunc, error) {
	t.Helper()
	type result struct {
		in  *envelope.Incoming
		ack ingest.AckFunc
		err error
	}
	done := make(chan result, 1)
	go func() {
		in, ack, err := src.Read(ctx)
		done <- result{in, ack, err}
	}()
	select {
	case r := <-done:
		return r.in, r.ack, r.err
	case <-time.After(limit):
		t.Fatalf("Read did not return within %v", limit)
		return nil, nil, nil
	}
}

// testReadContext: Read returns ctx.Err() when its context ends, and the
// Source is still usable afterwards.
func (s *suite) testReadContext(t *testing.T) {
	key := s.key(t)
	src := s.open(t, key)
	ready(t, src.Source, s.h.Timeout)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := readWithin(t, src, ctx, 5*time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("Read with a cancelled context: err = %v, want context.Canceled", err)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, _, err := readWithin(t, src, ctx, 5*time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Read past its deadline on an empty source: err = %v, want context.DeadlineExceeded", err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	stop := time.AfterFunc(100*time.Millisecond, cancel) // cancels a Read that is (most likely) blocked
	defer stop.Stop()
	if _, _, err := readWithin(t, src, ctx, 5*time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("Read cancelled while waiting: err = %v, want context.Canceled", err)
	}

	id := s.send(t, key, Message{Body: []byte("after cancel")})
	src.collect(t, s.h.Timeout, []string{id})
}

// testClose: Close ends a blocked Read with ErrClosed; Read after Close
// returns ErrClosed; a second Close and an ack after Close do not panic.
func (s *suite) testClose(t *testing.T) {
	key := s.key(t)
	src := s.open(t, key)
	id := s.send(t, key, Message{Body: []byte("held over close")})
	held := src.next(t, s.h.Timeout, "the message")
	if held.id != id {
		t.Fatalf("got message %s, want %s", held.id, id)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	blocked := make(chan error, 1)
	go func() {
		_, _, err := src.Read(ctx)
		blocked <- err
	}()
	start := time.Now()
	src.close(t)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Close took %v", d)
	}
	select {
	case err := <-blocked:
		if !errors.Is(err, ingest.ErrClosed) {
			t.Errorf("Read blocked during Close: err = %v, want ingest.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Read blocked during Close did not return within 10s after Close")
	}

	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	if _, _, err := readWithin(t, src.Source, rctx, 10*time.Second); !errors.Is(err, ingest.ErrClosed) {
		t.Errorf("Read after Close: err = %v, want ingest.ErrClosed", err)
	}

	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	if err := src.Source.Close(cctx); err != nil {
		t.Logf("second Close: %v", err) // allowed; it must just not panic or hang
	}
	if err := held.ack(cctx, nil); err != nil {
		t.Logf("ack after Close: %v", err) // allowed: the message will come again
	}
}

// testBrokerRestart: Ready reports the broker's absence, the Source
// reconnects by itself, and nothing is lost across the restart.
func (s *suite) testBrokerRestart(t *testing.T) {
	if s.h.StopBroker == nil {
		t.Skip("Harness.StopBroker is nil: the test cannot restart the broker")
	}
	key := s.key(t)
	src := s.open(t, key)
	r := ready(t, src.Source, s.h.Timeout)
	msgKey := []byte("restart")
	before := s.sendN(t, key, 20, msgKey)
	got := map[string]delivery{}
	var acked, held []string
	for len(got) < 15 {
		m := src.next(t, s.h.Timeout, "messages published before the restart")
		if _, dup := got[m.id]; dup {
			settle(t, m, nil)
			continue
		}
		got[m.id] = m
		if len(got) <= 10 {
			settle(t, m, nil)
			acked = append(acked, m.id)
		} else {
			held = append(held, m.id) // acknowledged after the restart
		}
	}
	var unread []string
	for _, id := range before {
		if _, ok := got[id]; !ok {
			unread = append(unread, id)
		}
	}

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
	s.h.StartBroker(t)
	down = false
	ready(t, src.Source, s.h.Timeout)

	for _, id := range held {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := got[id].ack(ctx, nil); err != nil {
			t.Logf("ack of %s after the restart: %v (allowed: it is delivered again)", id, err)
		}
		cancel()
	}
	after := s.sendN(t, key, 20, msgKey)
	want := after
	if s.h.Features.AtLeastOnce {
		want = append(append([]string(nil), unread...), after...)
	}
	src.collect(t, s.redeliveryWait(), want)
}

// testRelease: a Source that hands its work back (ingest.Releaser, what an
// instance cut off from Redis does) lets another instance take every
// message it held unacknowledged: those Read returned before Release (given
// back with their AckFunc, as the pipeline does), those it had fetched
// (which Read may still return, to be given back the same way), and those
// still on the broker. While released it takes nothing new; after Resume it
// reads again.
func (s *suite) testRelease(t *testing.T) {
	if !s.h.Features.AtLeastOnce {
		t.Skip("Features.AtLeastOnce is false: the broker keeps nothing to hand to another instance")
	}
	key := s.key(t)
	a := s.open(t, key)
	rel, ok := a.Source.(ingest.Releaser)
	if !ok {
		t.Fatalf("%T does not implement ingest.Releaser: an at-least-once Source must, so that an instance cut off from Redis hands its work to the others", a.Source)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := s.sendN(t, key, 10, []byte("release"))
	first := a.next(t, s.h.Timeout, "the first message") // the rest is fetched, or on the broker
	if err := rel.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := rel.Release(ctx); err != nil {
		t.Fatalf("Release a second time: %v", err)
	}
	settle(t, first, errNack)

	// A gives back whatever it still returns; it must return nothing
	// published after the Release.
	type aRead struct{ id string }
	reads := make(chan aRead, 100)
	actx, stopA := context.WithCancel(context.Background())
	aDone := make(chan struct{})
	go func() {
		defer close(aDone)
		for {
			in, ack, err := a.Read(actx)
			if err != nil {
				return
			}
			id, _ := in.Headers.Get(IDHeader)
			reads <- aRead{id}
			_ = ack(context.Background(), errNack) // given back; after Release an error is allowed too
		}
	}()

	b := s.open(t, key)
	later := s.send(t, key, s.plain("after the release", []byte("release")))
	b.collect(t, s.redeliveryWait(), append(slices.Clone(ids), later))
	b.close(t)
	stopA()
	<-aDone
	close(reads)
	for r := range reads {
		if r.id == later {
			t.Errorf("the released Source read message %s, published after Release: it must take nothing new until Resume", later)
		}
	}

	if err := rel.Resume(ctx); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := rel.Resume(ctx); err != nil {
		t.Fatalf("Resume a second time: %v", err)
	}
	again := s.send(t, key, s.plain("after the resume", []byte("release")))
	seen, _ := a.collect(t, s.redeliveryWait(), []string{again})
	for _, id := range append(ids, later) {
		if seen[id] > 0 {
			t.Errorf("message %s, acknowledged by the other Source, was read again after Resume", id)
		}
	}
}
