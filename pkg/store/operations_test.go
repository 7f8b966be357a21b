package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// park parks msgs and fails unless every result is want.
func park(t *testing.T, s *store.Store, want store.ParkResult, msgs ...*envelope.Message) {
	t.Helper()
	res, err := s.Park(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r != want {
			t.Fatalf("park %s: %v, want %v", msgs[i].ID, r, want)
		}
	}
}

func inspect(t *testing.T, s *store.Store, id string) *store.Info {
	t.Helper()
	info, err := s.Inspect(context.Background(), id)
	if err != nil {
		t.Fatalf("inspect %s: %v", id, err)
	}
	return info
}

// A cancelled message read from a log stays cancelled when its ingest
// reads it again within the dedupe window (a delivery that a paused
// instance held, redelivered once its ack wait ran out): a duplicate, not
// parked again. A new publish of its ID (a later position) parks. The same
// for a group's cancel; without a window everything parks again.
func TestCancelledStaysCancelledOnReread(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 2, DedupeWindow: time.Minute})
	at := func(id string, pos uint64, group string) *envelope.Message {
		m := msg(id, time.Now().Add(time.Hour))
		m.Origin, m.Group = envelope.Origin{Log: "orders/0", Pos: pos}, group
		return m
	}
	park(t, s, store.Parked, at("c", 7, ""))
	if err := s.Cancel(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	park(t, s, store.Duplicate, at("c", 7, "")) // read again
	park(t, s, store.Duplicate, at("c", 6, "")) // an earlier one of the log
	park(t, s, store.Parked, at("c", 8, ""))    // a new publish reusing the ID

	park(t, s, store.Parked, at("g1", 20, "g"))
	park(t, s, store.Parked, at("g2", 21, "g"))
	if n, inflight, err := s.CancelGroup(ctx, "g"); err != nil || n != 2 || inflight != 0 {
		t.Fatalf("cancel group: %d cancelled, %d in flight, %v; want 2, 0", n, inflight, err)
	}
	park(t, s, store.Duplicate, at("g1", 20, "g"))
	park(t, s, store.Duplicate, at("g2", 21, "g"))

	off := store.New(r.Client(), store.Options{Prefix: "u", Shards: 2})
	park(t, off, store.Parked, at("c", 7, ""))
	if err := off.Cancel(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	park(t, off, store.Parked, at("c", 7, ""))
}

// A delivered message's re-read within the dedupe window is a duplicate;
// any other message with that ID parks as the new message it is
// (envelope.Origin); without a window everything parks again.
func TestDedupeWindow(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 2, DedupeWindow: time.Minute})
	deliver := func(m *envelope.Message) {
		t.Helper()
		park(t, s, store.Parked, m)
		c, err := s.Claim(ctx, s.ShardOf(m.ID), 10, time.Minute, nil)
		if err != nil || len(c.Messages) != 1 {
			t.Fatalf("claim: %+v %v", c, err)
		}
		if n, err := s.Ack(ctx, c, []store.Done{{ID: m.ID, Origin: m.Origin}}); err != nil || n != 1 {
			t.Fatalf("ack: %d %v", n, err)
		}
	}
	at := func(id string, o envelope.Origin, redelivered bool) *envelope.Message {
		m := msg(id, time.Now().Add(-time.Millisecond))
		m.Origin, m.Redelivered = o, redelivered
		return m
	}
	// From a log (Kafka, JetStream): the same position and an earlier one
	// are re-reads; a later one, or another log, is a new message.
	kafka := envelope.Origin{Log: "orders/3", Pos: 10}
	deliver(at("k", kafka, false))
	park(t, s, store.Duplicate, at("k", kafka, false))
	park(t, s, store.Duplicate, at("k", envelope.Origin{Log: "orders/3", Pos: 9}, false))
	deliver(at("k", envelope.Origin{Log: "orders/3", Pos: 11}, false)) // a new publish reusing the ID
	park(t, s, store.Duplicate, at("k", envelope.Origin{Log: "orders/3", Pos: 11}, false))
	park(t, s, store.Parked, at("k", envelope.Origin{Log: "orders/4", Pos: 1}, false))
	if err := s.Cancel(ctx, "k"); err != nil {
		t.Fatal(err)
	}

	// Without a log (AMQP): a redelivery of the same content is a re-read;
	// a new publish (not redelivered, or other content: a Celery retry)
	// is a new message.
	amqp := envelope.Origin{Print: 0xabc}
	deliver(at("a", amqp, false))
	park(t, s, store.Duplicate, at("a", amqp, true))
	park(t, s, store.Parked, at("a", envelope.Origin{Print: 0xdef}, true))
	if err := s.Cancel(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	park(t, s, store.Parked, at("a", amqp, false))
	if err := s.Cancel(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// Without an ID of its own (an AMQP publish without message_id), each
	// delivery's ID is made up anew, and nothing tells a redelivery of a
	// delivery parked from another publish of the same bytes that some
	// other consumer returned: each parks as a new message, a duplicate at
	// worst and never a loss ("any other redelivery, whatever its ID and
	// body, parks as a new message").
	var noIDs []string
	for i := range 9 {
		in := &envelope.Incoming{Source: "q", Body: []byte("same"), Headers: envelope.Headers{{Key: envelope.HeaderDelay, Value: "0"}},
			Origin: envelope.Origin{Print: 0x5eed}, Redelivered: i > 0}
		d := envelope.Parse(in, &envelope.Route{Sink: "s", Destination: "d"}, envelope.Limits{}, time.Now(), envelope.NewID)
		if d.Message == nil {
			t.Fatalf("parse: %+v", d)
		}
		park(t, s, store.Parked, d.Message)
		noIDs = append(noIDs, d.Message.ID)
	}
	for _, id := range noIDs {
		if err := s.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	// Once the broker is seen to process the ack (AcksConfirmed), a
	// redelivery of the same content is a new publish that some other
	// consumer returned (nack with requeue): parked, not a duplicate.
	deliver(at("b", amqp, false))
	if err := s.AcksConfirmed(ctx, []*envelope.Message{at("b", amqp, false)}); err != nil {
		t.Fatal(err)
	}
	park(t, s, store.Parked, at("b", amqp, true))
	// ... and while that one is in flight, a redelivery of a delivery not
	// confirmed yet waits as one more message of its ID only when it is new.
	c, err := s.Claim(ctx, s.ShardOf("b"), 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 1 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	park(t, s, store.Duplicate, at("b", amqp, true))
	if err := s.AcksConfirmed(ctx, []*envelope.Message{at("b", amqp, false)}); err != nil {
		t.Fatal(err)
	}
	park(t, s, store.Queued, at("b", amqp, true))
	if err := s.Cancel(ctx, "b"); !errors.Is(err, store.ErrInFlight) {
		t.Fatalf("cancel of a message in flight: %v, want ErrInFlight", err)
	}
	if n, err := s.Ack(ctx, c, []store.Done{{ID: "b"}}); err != nil || n != 1 {
		t.Fatalf("ack: %d %v", n, err)
	}
	if err := s.Cancel(ctx, "b"); err != nil { // the one that waited, parked now
		t.Fatal(err)
	}
	// Nothing to compare (the admin API, core NATS): always new.
	deliver(at("n", envelope.Origin{}, false))
	park(t, s, store.Parked, at("n", envelope.Origin{}, true))
	if mark, _ := remembered(t, r.Client(), s, "n", ""); mark != "" {
		t.Fatal("a message without an origin is remembered: nothing can re-read it")
	}
	// What is remembered is a field of the shard's bucket of the window,
	// which expires whole, within three windows (a bucket is read while it
	// or the next one is current, and a window more for instances whose
	// clocks are behind).
	mark, ttl := remembered(t, r.Client(), s, "k", "orders/3")
	if mark != "11" || ttl <= 0 || ttl > 3*time.Minute {
		t.Fatalf("remembered %q with a TTL of %v, want the position 11 for at most three windows", mark, ttl)
	}
	// A re-read that an earlier build remembered (a key of its own per
	// message) is still a duplicate.
	legacy := at("l", envelope.Origin{Log: "orders/3", Pos: 30}, false)
	if err := r.Client().Set(ctx, s.Keys().Done(s.ShardOf("l"), "l", "orders/3"), "30", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	park(t, s, store.Duplicate, legacy)

	off := store.New(r.Client(), store.Options{Prefix: "off", Shards: 2})
	park(t, off, store.Parked, at("x", kafka, false))
	c, _ = off.Claim(ctx, off.ShardOf("x"), 10, time.Minute, nil)
	if _, err := off.Ack(ctx, c, []store.Done{{ID: "x", Origin: kafka}}); err != nil {
		t.Fatal(err)
	}
	park(t, off, store.Parked, at("x", kafka, false))
}

// A mark left in the bucket after the current one, by an instance whose
// clock is ahead into it, is found: park looks there when that bucket
// exists (once per call, not per message), and a re-read of the message is
// a duplicate.
func TestDedupeMarkOfAClockAhead(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	const window = time.Hour // one bucket for the test's length
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 2, DedupeWindow: window})
	o := envelope.Origin{Log: "orders/1", Pos: 7}
	m := msg("ahead", time.Now().Add(-time.Millisecond))
	m.Origin = o
	next := time.Now().UnixMilli()/window.Milliseconds() + 1
	bucket := s.Keys().Seen(s.ShardOf(m.ID), next)
	if err := r.Client().HSet(ctx, bucket, store.SeenField(m.ID, o.Log), "7").Err(); err != nil {
		t.Fatal(err)
	}
	// With others in the same call, as a fetched batch parks.
	other := msg("other", time.Now().Add(time.Hour))
	res, err := s.Park(ctx, []*envelope.Message{other, m})
	if err != nil {
		t.Fatal(err)
	}
	if res[0] != store.Parked || res[1] != store.Duplicate {
		t.Fatalf("park: %v, want [parked duplicate]", res)
	}
}

// TestVersionOrder: of two versions of an ID, the newer is the later in one
// log; else the later broker time, at full resolution; else the one parked
// later (envelope.Origin).
func TestVersionOrder(t *testing.T) {
	s := newStore(t, 2)
	t0 := time.Now().Truncate(time.Millisecond).Add(-time.Minute)
	v := func(id, body string, o envelope.Origin, pub time.Time) *envelope.Message {
		m := msg(id, time.Now().Add(time.Hour))
		m.Body, m.Replace, m.Origin, m.PublishedAt = []byte(body), true, o, pub
		return m
	}
	body := func(id string) string { return string(inspect(t, s, id).Message.Body) }
	// One log: the offset decides, whatever the timestamps say (a producer
	// clock a year ahead cannot hold a later record back).
	park(t, s, store.Parked, v("k", "v1", envelope.Origin{Log: "t/0", Pos: 5}, t0.AddDate(1, 0, 0)))
	park(t, s, store.Replaced, v("k", "v2", envelope.Origin{Log: "t/0", Pos: 6}, t0))
	park(t, s, store.NotNewer, v("k", "v1", envelope.Origin{Log: "t/0", Pos: 5}, t0.AddDate(1, 0, 0)))
	park(t, s, store.NotNewer, v("k", "v2", envelope.Origin{Log: "t/0", Pos: 6}, t0))
	if got := body("k"); got != "v2" {
		t.Fatalf("one log: %s", got)
	}
	// Two logs (two JetStream streams): the publish time, to the nanosecond.
	park(t, s, store.Parked, v("j", "a", envelope.Origin{Log: "S1", Pos: 9}, t0.Add(500)))
	park(t, s, store.NotNewer, v("j", "b", envelope.Origin{Log: "S2", Pos: 1}, t0.Add(400)))
	park(t, s, store.Replaced, v("j", "c", envelope.Origin{Log: "S2", Pos: 2}, t0.Add(501)))
	if got := body("j"); got != "c" {
		t.Fatalf("two logs: %s", got)
	}
	// No broker time (RabbitMQ, the admin API), or the same one: the one
	// parked later.
	park(t, s, store.Parked, v("r", "first", envelope.Origin{Print: 1}, time.Time{}))
	park(t, s, store.Replaced, v("r", "second", envelope.Origin{Print: 2}, time.Time{}))
	park(t, s, store.Replaced, v("r", "third", envelope.Origin{}, t0))
	park(t, s, store.Replaced, v("r", "fourth", envelope.Origin{}, t0))
	if got := body("r"); got != "fourth" {
		t.Fatalf("park order: %s", got)
	}
}

// remembered returns what the dedupe window keeps of message id read from
// log, and the time to live of the bucket that holds it ("" and 0 when
// none does).
func remembered(t *testing.T, rdb redis.UniversalClient, s *store.Store, id, log string) (string, time.Duration) {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, s.Keys().Seen(s.ShardOf(id), 0)[:len(s.Keys().Seen(s.ShardOf(id), 0))-1]+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if v, err := rdb.HGet(ctx, k, store.SeenField(id, log)).Result(); err == nil {
			ttl, _ := rdb.PTTL(ctx, k).Result()
			return v, ttl
		}
	}
	return "", 0
}

// Replace: the newer publish time wins; an older redelivery never undoes a
// newer replacement; a replacement of a message in flight waits for it.
func TestReplace(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 4)
	t0 := time.Now().Truncate(time.Millisecond)
	version := func(pub time.Duration, due time.Time, body string) *envelope.Message {
		m := msg("r", due)
		m.Body, m.Replace, m.PublishedAt = []byte(body), true, t0.Add(pub)
		m.Group = "g-" + body
		return m
	}
	park(t, s, store.Parked, version(0, t0.Add(time.Hour), "v1"))
	park(t, s, store.Replaced, version(time.Second, t0.Add(2*time.Hour), "v2"))
	park(t, s, store.NotNewer, version(500*time.Millisecond, t0.Add(time.Minute), "v1.5")) // a redelivered older one
	info := inspect(t, s, "r")
	if string(info.Message.Body) != "v2" || !info.Message.DueAt.Equal(t0.Add(2*time.Hour)) || !info.NextAt.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("after replace: %s due %v next %v", info.Message.Body, info.Message.DueAt, info.NextAt)
	}
	if ids, _ := s.GroupMembers(ctx, "g-v1", 0); len(ids) != 0 {
		t.Fatalf("the replaced message is still in its old group: %v", ids)
	}
	if ids, _ := s.GroupMembers(ctx, "g-v2", 0); len(ids) != 1 {
		t.Fatalf("the replacement is not in its group: %v", ids)
	}
	// Without Replace, a known ID is left alone.
	plain := msg("r", t0)
	park(t, s, store.Known, plain)

	// In flight: the replacement waits and is parked when the version in
	// flight is acknowledged.
	if _, err := s.Reschedule(ctx, "r", t0.Add(-time.Second), time.Time{}); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, s.ShardOf("r"), 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 1 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	park(t, s, store.Queued, version(2*time.Second, t0.Add(3*time.Hour), "v3"))
	// An older replacement read after it (a redelivery) does not take its
	// place behind the version in flight.
	park(t, s, store.NotNewer, version(1500*time.Millisecond, t0.Add(time.Minute), "v2.5"))
	if info := inspect(t, s, "r"); info.State != store.StateInflight || string(info.Message.Body) != "v2" {
		t.Fatalf("in flight: %s %s", info.State, info.Message.Body)
	}
	if _, err := s.Ack(ctx, c, acks("r")); err != nil {
		t.Fatal(err)
	}
	info = inspect(t, s, "r")
	if info.State != store.StateScheduled || string(info.Message.Body) != "v3" || !info.NextAt.Equal(t0.Add(3*time.Hour)) {
		t.Fatalf("after the ack: %s %s next %v", info.State, info.Message.Body, info.NextAt)
	}
}

// A new message of a series' ID that comes while an occurrence is in
// flight waits (a follower) and, when the occurrence's ack parks the next
// one, is dropped: the series goes on, as such a message is a no-op while
// the series is parked.
func TestFollowerOfASeriesInFlight(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 2)
	due := time.Now().Add(-time.Millisecond).Truncate(time.Millisecond)
	series := msg("s", due)
	series.Body = []byte("the series")
	series.Recur = &envelope.Recurrence{Every: time.Minute, Anchor: due, N: 1}
	park(t, s, store.Parked, series)
	c, err := s.Claim(ctx, s.ShardOf("s"), 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 1 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	newcomer := msg("s", due.Add(time.Hour))
	newcomer.Body = []byte("a new message of its ID")
	park(t, s, store.Queued, newcomer)
	next := *series
	next.Recur = &envelope.Recurrence{Every: time.Minute, Anchor: due, N: 2}
	next.DueAt = due.Add(time.Minute)
	if _, err := s.Ack(ctx, c, []store.Done{{ID: "s", Next: &next}}); err != nil {
		t.Fatal(err)
	}
	info := inspect(t, s, "s")
	if string(info.Message.Body) != "the series" || info.Message.Recur == nil || info.Message.Recur.N != 2 {
		t.Fatalf("after the occurrence's ack: %q %+v, want the series' occurrence 2", info.Message.Body, info.Message.Recur)
	}
	park(t, s, store.Known, newcomer) // as while the series is parked
}

// A cancel (by ID or by group) that finds an occurrence of a series in
// flight answers so (ErrInFlight: it may be published), and ends the
// series with it: its ack parks no next occurrence, and a failed publish
// is not tried again.
func TestCancelInFlightEndsTheSeries(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 2)
	due := time.Now().Add(-time.Millisecond).Truncate(time.Millisecond)
	series := func(id string) *envelope.Message {
		m := msg(id, due)
		m.Group = "g-" + id
		m.Recur = &envelope.Recurrence{Every: time.Minute, Anchor: due, N: 1}
		return m
	}
	claim := func(id string) *store.Lease {
		t.Helper()
		c, err := s.Claim(ctx, s.ShardOf(id), 10, time.Minute, nil)
		if err != nil || len(c.Messages) != 1 || c.Messages[0].ID != id {
			t.Fatalf("claim %s: %+v %v", id, c, err)
		}
		return c
	}
	gone := func(id string) {
		t.Helper()
		if _, err := s.Inspect(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s after its cancelled occurrence: %v, want not found", id, err)
		}
	}
	// Acked: no next occurrence.
	park(t, s, store.Parked, series("a"))
	c := claim("a")
	if err := s.Cancel(ctx, "a"); !errors.Is(err, store.ErrInFlight) || !errors.Is(err, store.ErrSeriesEnds) {
		t.Fatalf("cancel in flight: %v, want ErrInFlight and ErrSeriesEnds", err)
	}
	if info := inspect(t, s, "a"); !info.SeriesEnds {
		t.Error("Inspect of the occurrence whose series the cancel ended: SeriesEnds not set")
	}
	if p, err := s.Browse(ctx, store.BrowseQuery{}); err != nil || len(p.Messages) != 1 || !p.Messages[0].SeriesEnds {
		t.Errorf("a listing of the occurrence whose series the cancel ended: %+v %v, want SeriesEnds", p, err)
	}
	next := *series("a")
	next.DueAt, next.Recur = due.Add(time.Minute), &envelope.Recurrence{Every: time.Minute, Anchor: due, N: 2}
	if _, err := s.Ack(ctx, c, []store.Done{{ID: "a", Next: &next}}); err != nil {
		t.Fatal(err)
	}
	gone("a")
	// A new message of the ID after such a cancel waits for the occurrence
	// and is parked once the series has ended.
	park(t, s, store.Parked, series("a2"))
	c = claim("a2")
	if err := s.Cancel(ctx, "a2"); !errors.Is(err, store.ErrInFlight) {
		t.Fatalf("cancel in flight: %v", err)
	}
	again := msg("a2", due.Add(time.Hour))
	again.Body = []byte("after the cancel")
	park(t, s, store.Queued, again)
	next = *series("a2")
	next.DueAt, next.Recur = due.Add(time.Minute), &envelope.Recurrence{Every: time.Minute, Anchor: due, N: 2}
	if _, err := s.Ack(ctx, c, []store.Done{{ID: "a2", Next: &next}}); err != nil {
		t.Fatal(err)
	}
	if info := inspect(t, s, "a2"); string(info.Message.Body) != "after the cancel" || info.Message.Recur != nil {
		t.Fatalf("after the series ended: %q %+v, want the new message", info.Message.Body, info.Message.Recur)
	}
	if err := s.Cancel(ctx, "a2"); err != nil {
		t.Fatal(err)
	}
	// A failed publish: not tried again. By group this time.
	park(t, s, store.Parked, series("b"))
	c = claim("b")
	if n, inflight, err := s.CancelGroup(ctx, "g-b"); err != nil || n != 0 || inflight != 1 {
		t.Fatalf("cancel group in flight: %d %d %v", n, inflight, err)
	}
	if _, err := s.Retry(ctx, c, []store.RetryAt{{ID: "b", At: due.Add(time.Second), Reason: "timeout"}}); err != nil {
		t.Fatal(err)
	}
	gone("b")
	// Nor put back: postponed (a destination that stalls), held (its sink
	// went down), or deferred to a publish slot.
	for i, putBack := range []func(c *store.Lease, id string) error{
		func(c *store.Lease, id string) error {
			_, err := s.Postpone(ctx, c, []store.RetryAt{{ID: id, At: due.Add(time.Second), Reason: "did not answer"}})
			return err
		},
		func(c *store.Lease, id string) error {
			_, err := s.Hold(ctx, c, []store.Unavailable{{ID: id, Band: 0, DueAt: due}})
			return err
		},
		func(c *store.Lease, id string) error {
			_, err := s.Defer(ctx, c, []store.Slot{{ID: id, At: due.Add(time.Second)}})
			return err
		},
	} {
		id := fmt.Sprint("put-back-", i)
		park(t, s, store.Parked, series(id))
		c = claim(id)
		if err := s.Cancel(ctx, id); !errors.Is(err, store.ErrSeriesEnds) {
			t.Fatalf("cancel %s in flight: %v", id, err)
		}
		if err := putBack(c, id); err != nil {
			t.Fatal(err)
		}
		gone(id)
	}
	if st, err := s.Stats(ctx); err != nil || st.Series != 0 {
		t.Errorf("live series %d (%v), want 0", st.Series, err)
	}
}

// Occupied tells a shard a claim could take something from (a parked
// message of any priority, one in flight whose lease will end) from an
// empty one, and from one that holds only held messages.
func TestOccupied(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 4)
	states, err := s.SinkStates(ctx, []string{"down"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	byShard := map[int]*envelope.Message{}
	for i := 0; len(byShard) < 3; i++ {
		m := msg(fmt.Sprint("m", i), now.Add(time.Hour))
		if sh := s.ShardOf(m.ID); byShard[sh] == nil && sh < 3 {
			byShard[sh] = m
		}
	}
	// shard 0: parked at priority 7; shard 1: in flight; shard 2: held; shard 3: empty
	byShard[0].Priority = 7
	byShard[1].DueAt = now.Add(-time.Second).Truncate(time.Millisecond)
	byShard[2].DueAt, byShard[2].Sink = now.Add(-time.Second).Truncate(time.Millisecond), "down"
	park(t, s, store.Parked, byShard[0], byShard[1], byShard[2])
	if c, err := s.Claim(ctx, 1, 10, time.Minute, nil); err != nil || len(c.Messages) != 1 {
		t.Fatalf("claim of shard 1: %+v %v", c, err)
	}
	if c, err := s.Claim(ctx, 2, 10, time.Minute, map[string]int{"down": states["down"].Band}); err != nil || len(c.Messages) != 0 {
		t.Fatalf("claim of shard 2 with its sink down: %+v %v", c, err)
	}
	got, err := s.Occupied(ctx, []int{3, 2, 1, 0})
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{false, false, true, true}; !slices.Equal(got, want) {
		t.Fatalf("occupied (shards 3, 2, 1, 0): %v, want %v", got, want)
	}
}

// ReleaseAll brings back every held message of one sink, in every shard
// and due set, more than a call's max, and leaves another sink's held
// messages held; with nothing held it runs no script (counted on the
// single Redis).
func TestReleaseAll(t *testing.T) {
	onSingleAndCluster(t, testReleaseAll)
}

func testReleaseAll(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	s := store.New(rdb, store.Options{Prefix: "t", Shards: 4, MaxDead: 10})
	states, err := s.SinkStates(ctx, []string{"down", "other"})
	if err != nil {
		t.Fatal(err)
	}
	blocked := map[string]int{"down": states["down"].Band, "other": states["other"].Band}
	now := time.Now().Truncate(time.Millisecond)
	var msgs []*envelope.Message
	for i := range 40 {
		m := msg(fmt.Sprintf("m%d", i), now.Add(-time.Duration(i+1)*time.Second))
		m.Sink, m.Priority = "down", uint8(i%3*4) // priorities 0, 4 and 8
		if i%5 == 0 {
			m.Sink = "other"
		}
		msgs = append(msgs, m)
	}
	park(t, s, store.Parked, msgs...)
	for sh := range s.Shards() {
		if c, err := s.Claim(ctx, sh, 100, time.Minute, blocked); err != nil || len(c.Messages) != 0 {
			t.Fatalf("claim of shard %d with both sinks blocked: %d %v", sh, len(c.Messages), err)
		}
	}
	if n, err := s.ReleaseAll(ctx, states["down"].Band, 3); err != nil || n != 32 {
		t.Fatalf("released %d of sink down's 32 held (%v)", n, err)
	}
	for _, m := range msgs {
		if info := inspect(t, s, m.ID); info.Held != (m.Sink == "other") {
			t.Fatalf("%s of sink %s after releasing sink down: %+v", m.ID, m.Sink, info)
		}
	}
	single, ok := rdb.(*redis.Client)
	if !ok {
		return
	}
	scripts := func() float64 {
		stats, err := testenv.CommandStats(single)
		if err != nil {
			t.Fatal(err)
		}
		return stats["evalsha"].Calls + stats["eval"].Calls + stats["fcall"].Calls
	}
	before := scripts()
	if n, err := s.ReleaseAll(ctx, states["down"].Band, 3); err != nil || n != 0 {
		t.Fatalf("second release of sink down: %d %v", n, err)
	}
	if after := scripts(); after != before {
		t.Fatalf("a release with nothing held ran %v scripts", after-before)
	}
}

// A held message keeps its due order in its sink's band, is not claimed,
// still counts as parked and due, and comes back by Release.
func TestHoldAndRelease(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	states, err := s.SinkStates(ctx, []string{"down", "up"})
	if err != nil || len(states) != 2 {
		t.Fatalf("states %v %v", states, err)
	}
	band := states["down"].Band
	now := time.Now().Truncate(time.Millisecond)
	var msgs []*envelope.Message
	for i := range 6 {
		m := msg(fmt.Sprintf("d%d", i), now.Add(time.Duration(i-10)*time.Second))
		if i%2 == 0 {
			m.Sink = "down"
		} else {
			m.Sink = "up"
		}
		msgs = append(msgs, m)
	}
	park(t, s, store.Parked, msgs...)
	c, err := s.Claim(ctx, 0, 100, time.Minute, map[string]int{"down": band})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Messages) != 3 {
		t.Fatalf("claimed %d, want the 3 of sink up", len(c.Messages))
	}
	for _, m := range c.Messages {
		if m.Message.Sink != "up" {
			t.Fatalf("claimed a message of the blocked sink: %s", m.ID)
		}
	}
	info := inspect(t, s, "d0")
	if info.State != store.StateHeld || !info.Held || !info.NextAt.Equal(msgs[0].DueAt) {
		t.Fatalf("held message: %+v", info)
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Held != 3 || st.Parked != 6 || st.Due != 3 {
		// the 3 in flight have a lease a minute ahead: not due
		t.Fatalf("stats: held %d parked %d due %d (%v)", st.Held, st.Parked, st.Due, err)
	}
	if !st.OldestDue.Equal(msgs[0].DueAt) {
		t.Fatalf("oldest due %v, want the held d0's %v", st.OldestDue, msgs[0].DueAt)
	}
	// A claim with the sink still blocked takes nothing more.
	if c2, _ := s.Claim(ctx, 0, 100, time.Minute, map[string]int{"down": band}); len(c2.Messages) != 0 {
		t.Fatalf("claimed %d held messages", len(c2.Messages))
	}
	// An in-flight message whose sink went down is held without counting
	// the attempt.
	if n, err := s.Hold(ctx, c, []store.Unavailable{{ID: "d1", Band: states["up"].Band, DueAt: msgs[1].DueAt}}); err != nil || n != 1 {
		t.Fatalf("hold: %d %v", n, err)
	}
	if info := inspect(t, s, "d1"); !info.Held || info.Attempts != 0 {
		t.Fatalf("held in-flight message: %+v", info)
	}
	// A held message rescheduled, or replaced, stays held for its sink, at
	// its new due time (still before d4's, then after d2's: the release's
	// order below is kept).
	d2 := msgs[0].DueAt.Add(time.Second)
	if _, err := s.Reschedule(ctx, "d2", d2, time.Time{}); err != nil {
		t.Fatalf("reschedule of a held message: %v", err)
	}
	if info := inspect(t, s, "d2"); info.State != store.StateHeld || !info.NextAt.Equal(d2) {
		t.Fatalf("held message rescheduled: %+v, want held, due %v", info, d2)
	}
	d4 := msg("d4", d2.Add(time.Second))
	d4.Sink, d4.Replace = "down", true
	if r, err := s.Park(ctx, []*envelope.Message{d4}); err != nil || r[0] != store.Replaced {
		t.Fatalf("replace of a held message: %v %v", r, err)
	}
	if info := inspect(t, s, "d4"); info.State != store.StateHeld || !info.NextAt.Equal(d4.DueAt) {
		t.Fatalf("held message replaced: %+v, want held, due %v", info, d4.DueAt)
	}
	// Release brings them back, in due order.
	if n, err := s.Release(ctx, 0, band, 2); err != nil || n != 2 {
		t.Fatalf("release: %d %v", n, err)
	}
	if n, err := s.Release(ctx, 0, band, 10); err != nil || n != 1 {
		t.Fatalf("release the rest: %d %v", n, err)
	}
	c3, err := s.Claim(ctx, 0, 100, time.Minute, nil)
	if err != nil || len(c3.Messages) != 3 {
		t.Fatalf("claim after release: %d %v", len(c3.Messages), err)
	}
	for i, want := range []string{"d0", "d2", "d4"} {
		if c3.Messages[i].ID != want || c3.Messages[i].Attempt != 1 {
			t.Fatalf("claim after release: #%d %s attempt %d, want %s attempt 1", i, c3.Messages[i].ID, c3.Messages[i].Attempt, want)
		}
	}
}

// A held message moved later, by a reschedule or a replacement, is
// scheduled until its new time (a paused sink's message not yet due is not
// held), and a replacement for another sink leaves the band of the first;
// one still due for the same sink stays held.
func TestHeldMovedLaterIsScheduled(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	states, err := s.SinkStates(ctx, []string{"down"})
	if err != nil {
		t.Fatal(err)
	}
	blocked := map[string]int{"down": states["down"].Band}
	past := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	var msgs []*envelope.Message
	for i := range 4 {
		m := msg(fmt.Sprintf("h%d", i), past.Add(time.Duration(i)*time.Second))
		m.Sink = "down"
		msgs = append(msgs, m)
	}
	park(t, s, store.Parked, msgs...)
	if c, err := s.Claim(ctx, 0, 100, time.Minute, blocked); err != nil || len(c.Messages) != 0 {
		t.Fatalf("claimed %d messages of a blocked sink (%v)", len(c.Messages), err)
	}
	later := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if _, err := s.Reschedule(ctx, "h0", later, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if info := inspect(t, s, "h0"); info.State != store.StateScheduled || info.Held || !info.NextAt.Equal(later) {
		t.Fatalf("held message rescheduled an hour later: %+v, want scheduled at %v", info, later)
	}
	if _, err := s.Reschedule(ctx, "h1", past.Add(-time.Second), time.Time{}); err != nil {
		t.Fatal(err)
	}
	if info := inspect(t, s, "h1"); info.State != store.StateHeld {
		t.Fatalf("held message rescheduled to a time passed: %+v, want held", info)
	}
	elsewhere := msg("h2", past)
	elsewhere.Sink, elsewhere.Replace = "up", true
	same := msg("h3", past)
	same.Sink, same.Replace = "down", true
	if r, err := s.Park(ctx, []*envelope.Message{elsewhere, same}); err != nil || r[0] != store.Replaced || r[1] != store.Replaced {
		t.Fatalf("replace of held messages: %v %v", r, err)
	}
	if info := inspect(t, s, "h3"); info.State != store.StateHeld {
		t.Fatalf("held message replaced, due, same sink: %+v, want held", info)
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Held != 2 {
		t.Fatalf("stats: held %d (%v), want h1 and h3", st.Held, err)
	}
	c, err := s.Claim(ctx, 0, 100, time.Minute, blocked)
	if err != nil || len(c.Messages) != 1 || c.Messages[0].ID != "h2" {
		t.Fatalf("claim with down blocked: %v (%v), want h2, replaced for sink up", c.Messages, err)
	}
}

// A release takes a sink's held messages highest priority first, due
// order within one, in both layouts: with more held than one call takes, a
// message of a higher priority due later leaves before those of a lower
// one due earlier, as a claim would take them.
func TestReleaseTakesHigherPriorityFirst(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	states, err := s.SinkStates(ctx, []string{"down"})
	if err != nil {
		t.Fatal(err)
	}
	band := states["down"].Band
	now := time.Now().Truncate(time.Millisecond)
	// low0..low2 at priority 0, due 10, 9, 8 s ago; high0, high1 at 7 and
	// mid0 at 3, due 2 and 1 s ago and just now
	var msgs []*envelope.Message
	add := func(id string, prio uint8, ago time.Duration) {
		m := msg(id, now.Add(-ago))
		m.Sink, m.Priority = "down", prio
		msgs = append(msgs, m)
	}
	for i := range 3 {
		add(fmt.Sprint("low", i), 0, time.Duration(10-i)*time.Second)
	}
	add("high0", 7, 2*time.Second)
	add("high1", 7, time.Second)
	add("mid0", 3, 0)
	park(t, s, store.Parked, msgs...)
	if c, err := s.Claim(ctx, 0, 100, time.Minute, map[string]int{"down": band}); err != nil || len(c.Messages) != 0 {
		t.Fatalf("claim with the sink down: %d %v", len(c.Messages), err)
	}
	for _, m := range msgs {
		if info := inspect(t, s, m.ID); !info.Held || info.Message.Priority != m.Priority {
			t.Fatalf("%s before the release: %+v", m.ID, info)
		}
	}
	// each call's two, found by which are no longer held
	var calls [][]string
	left := msgs
	for range 3 {
		if n, err := s.Release(ctx, 0, band, 2); err != nil || n != 2 {
			t.Fatalf("release of 2: %d %v", n, err)
		}
		var out []string
		left = slices.DeleteFunc(left, func(m *envelope.Message) bool {
			if inspect(t, s, m.ID).Held {
				return false
			}
			out = append(out, m.ID)
			return true
		})
		calls = append(calls, out)
	}
	want := [][]string{{"high0", "high1"}, {"low0", "mid0"}, {"low1", "low2"}}
	if !slices.EqualFunc(calls, want, slices.Equal) {
		t.Fatalf("released by call %v, want %v", calls, want)
	}
}

// Pause is kept in Redis for every instance.
func TestPause(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	if err := s.SetPaused(ctx, "k", true); err != nil {
		t.Fatal(err)
	}
	st, err := s.SinkStates(ctx, []string{"k", "j"})
	if err != nil || !st["k"].Paused || st["j"].Paused || st["k"].Band == st["j"].Band {
		t.Fatalf("states %+v %v", st, err)
	}
	_ = s.SetPaused(ctx, "k", false)
	if st, _ := s.SinkStates(ctx, nil); st["k"].Paused {
		t.Fatal("resumed sink still paused")
	}
}

// Slots are shared: two stores on one Redis get consecutive ones.
func TestSlots(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	a := store.New(r.Client(), store.Options{Prefix: "t", Shards: 1})
	b := store.New(r.Client(), store.Options{Prefix: "t", Shards: 1})
	now, sa, err := a.Slots(ctx, "k", 10, 100) // 10 ms apart
	if err != nil || len(sa) != 10 {
		t.Fatal(err)
	}
	_, sb, err := b.Slots(ctx, "k", 5, 100)
	if err != nil {
		t.Fatal(err)
	}
	if sa[0].After(now) {
		t.Fatalf("the first slot %v is after now %v", sa[0], now)
	}
	for i := 1; i < len(sa); i++ {
		if d := sa[i].Sub(sa[i-1]); d != 10*time.Millisecond {
			t.Fatalf("slot %d is %v after the previous", i, d)
		}
	}
	if sb[0].Before(sa[9].Add(10 * time.Millisecond)) {
		t.Fatalf("the other instance's first slot %v overlaps %v", sb[0], sa[9])
	}
	// Deferred messages are claimed as slotted, at their slot.
	s := newStore(t, 1)
	older := msg("older", time.Now().Add(-5*time.Second).Truncate(time.Millisecond))
	park(t, s, store.Parked, msg("late", time.Now().Add(-time.Second)), older)
	c, _ := s.Claim(ctx, 0, 10, time.Minute, nil)
	slot := time.Now().Add(50 * time.Millisecond)
	// The older message got the later slot (a priority's first, another
	// sink's rate): the oldest due is its due time all the same.
	if n, err := s.Defer(ctx, c, []store.Slot{{ID: "late", At: slot}, {ID: "older", At: slot.Add(time.Hour)}}); err != nil || n != 2 {
		t.Fatalf("defer: %d %v", n, err)
	}
	// Waiting for its slot, it is due (and overdue) in the stats, since
	// its due time: not scheduled at its slot. (Layout 1 keeps it among the
	// others at its slot, counted once the slot has come.)
	if st, err := s.Stats(ctx); err != nil {
		t.Fatal(err)
	} else if store.LayoutOfTests() >= 2 && (st.Due != 2 || st.DueIn.Overdue != 2 || !st.OldestDue.Equal(older.DueAt)) {
		t.Errorf("stats of messages waiting for their slots: due %d, overdue %d, oldest %v; want 2, 2, %v", st.Due, st.DueIn.Overdue, st.OldestDue, older.DueAt)
	}
	var got store.Claimed
	testenv.Eventually(t, 5*time.Second, func() bool {
		c, err := s.Claim(ctx, 0, 10, time.Minute, nil)
		if err != nil || len(c.Messages) == 0 {
			return false
		}
		got = c.Messages[0]
		return true
	}, "the deferred message")
	if !got.Slot.Equal(slot.Truncate(time.Millisecond)) || got.Attempt != 1 {
		t.Fatalf("claimed %+v, want its slot %v and its first attempt", got, slot)
	}
}

// Reschedule, with and without if_due_at; in flight is refused; fire now.
func TestRescheduleAndFire(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 2)
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	park(t, s, store.Parked, msg("a", due))
	later := due.Add(time.Hour)
	if _, err := s.Reschedule(ctx, "a", later, due.Add(time.Second)); !errors.Is(err, store.ErrDueAtMismatch) {
		t.Fatalf("reschedule with a wrong if_due_at: %v", err)
	}
	got, err := s.Reschedule(ctx, "a", later, due)
	if err != nil || !got.Equal(later) {
		t.Fatalf("reschedule: %v %v", got, err)
	}
	info := inspect(t, s, "a")
	if !info.Message.DueAt.Equal(later) || !info.NextAt.Equal(later) {
		t.Fatalf("after reschedule: due %v next %v", info.Message.DueAt, info.NextAt)
	}
	if _, err := s.Reschedule(ctx, "nope", later, time.Time{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown: %v", err)
	}
	if err := s.Fire(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, s.ShardOf("a"), 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 1 {
		t.Fatalf("fired message not due: %+v %v", c, err)
	}
	if _, err := s.Reschedule(ctx, "a", later, time.Time{}); !errors.Is(err, store.ErrInFlight) {
		t.Fatalf("reschedule in flight: %v", err)
	}
}

// TestInFlightPastItsLeaseMayHaveBeenPublished: a message whose lease
// ended without an outcome may have been sent by its claimer before the
// end (a holder paused, a broker slow to store it), and its broker may
// take that copy yet: a cancel, a group cancel or a change meets it as in
// flight, before a claim takes it over and after, held or not, until a
// publish of it is confirmed. They took it, and the copy came after a 204.
func TestInFlightPastItsLeaseMayHaveBeenPublished(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 1, MaxDead: 1000})
	const lease = 100 * time.Millisecond
	var ids []string
	for _, id := range []string{"held", "taken"} {
		m := msg(id, time.Now().Add(-time.Millisecond))
		m.Group, m.Sink = "g", id // the sink "held" is blocked below
		park(t, s, store.Parked, m)
		ids = append(ids, id)
	}
	c, err := s.Claim(ctx, 0, 10, lease, nil)
	if err != nil || len(c.Messages) != 2 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		now, err := r.Client().Time(ctx).Result()
		return err == nil && now.UnixMilli() > c.ExpiryMs
	}, "the lease ended on Redis's clock")
	refused := func(when string) {
		t.Helper()
		for _, id := range ids {
			if err := s.Cancel(ctx, id); !errors.Is(err, store.ErrInFlight) {
				t.Fatalf("%s: cancel of %s: %v, want ErrInFlight", when, id, err)
			}
			if _, err := s.Reschedule(ctx, id, time.Now().Add(time.Hour), time.Time{}); !errors.Is(err, store.ErrInFlight) {
				t.Fatalf("%s: reschedule of %s: %v, want ErrInFlight", when, id, err)
			}
			if err := s.Fire(ctx, id); !errors.Is(err, store.ErrInFlight) {
				t.Fatalf("%s: fire of %s: %v, want ErrInFlight", when, id, err)
			}
		}
		if n, inflight, err := s.CancelGroup(ctx, "g"); err != nil || n != 0 || inflight != 2 {
			t.Fatalf("%s: group cancel: %d cancelled, %d in flight, %v; want 0 and 2", when, n, inflight, err)
		}
	}
	for _, id := range ids {
		if st := inspect(t, s, id).State; st != store.StateInflight {
			t.Fatalf("its lease ended: %s is %s, want inflight", id, st)
		}
	}
	refused("its lease ended")
	// Taken over, one held for its sink, one claimed: either may still
	// have been published. The claim does not say it was sent (nothing
	// says it was: a missed occurrence under route.missed skip is still
	// skipped).
	c2, err := s.Claim(ctx, 0, 10, time.Minute, map[string]int{"held": 0})
	if err != nil || len(c2.Messages) != 1 || c2.Messages[0].ID != "taken" || c2.Messages[0].Sent {
		t.Fatalf("claim after the lease: %+v %v, want taken, not said sent", c2, err)
	}
	if st := inspect(t, s, "held").State; st != store.StateHeld {
		t.Fatalf("taken over for a blocked sink: held is %s", st)
	}
	refused("taken over")
	// Released and claimed, the same.
	if _, err := s.Release(ctx, 0, 0, 100); err != nil {
		t.Fatal(err)
	}
	c3, err := s.Claim(ctx, 0, 10, time.Minute, nil)
	if err != nil || len(c3.Messages) != 1 || c3.Messages[0].ID != "held" || c3.Messages[0].Sent {
		t.Fatalf("claim after the release: %+v %v, want held, not said sent", c3, err)
	}
	refused("claimed again")
	// Once a publish of it is confirmed, it is gone.
	for _, l := range []*store.Lease{c2, c3} {
		if n, err := s.Ack(ctx, l, []store.Done{{ID: l.Messages[0].ID}}); err != nil || n != 1 {
			t.Fatalf("ack: %d %v", n, err)
		}
	}
	for _, id := range ids {
		if err := s.Cancel(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("cancel of %s after its publish was confirmed: %v, want ErrNotFound", id, err)
		}
	}
	if n := r.Client().HLen(ctx, s.Keys().Unconfirmed(0)).Val(); n != 0 {
		t.Fatalf("%d marks outlived their messages", n)
	}
}

// Groups: listed across shards, cancelled at once, index kept in step with
// acks and cancels.
func TestGroups(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 8)
	var msgs []*envelope.Message
	for i := range 50 {
		m := msg(fmt.Sprintf("g%02d", i), time.Now().Add(time.Hour))
		m.Group = "order-42"
		if i%5 == 0 {
			m.Group = "order-7"
		}
		msgs = append(msgs, m)
	}
	park(t, s, store.Parked, msgs...)
	ids, err := s.GroupMembers(ctx, "order-42", 0)
	if err != nil || len(ids) != 40 {
		t.Fatalf("members: %d %v", len(ids), err)
	}
	if err := s.Cancel(ctx, "g01"); err != nil {
		t.Fatal(err)
	}
	if ids, _ := s.GroupMembers(ctx, "order-42", 0); len(ids) != 39 {
		t.Fatalf("after a cancel: %d members", len(ids))
	}
	n, _, err := s.CancelGroup(ctx, "order-42")
	if err != nil || n != 39 {
		t.Fatalf("cancel group: %d %v", n, err)
	}
	st, _ := s.Stats(ctx)
	if st.Parked != 10 {
		t.Fatalf("parked %d after cancelling the group, want the 10 of order-7", st.Parked)
	}
	if ids, _ := s.GroupMembers(ctx, "order-7", 0); len(ids) != 10 {
		t.Fatalf("the other group: %d", len(ids))
	}
}

// A recurring message's ack parks its next occurrence in the same step.
func TestAckParksTheNextOccurrence(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	m := msg("every", time.Now().Add(-time.Millisecond))
	m.Group = "g"
	m.Recur = &envelope.Recurrence{Every: time.Minute, Anchor: m.DueAt, N: 1}
	park(t, s, store.Parked, m)
	c, _ := s.Claim(ctx, 0, 10, time.Minute, nil)
	next := *c.Messages[0].Message
	nr := *next.Recur
	nr.N = 2
	next.Recur, next.DueAt = &nr, m.DueAt.Add(time.Minute)
	if n, err := s.Ack(ctx, c, []store.Done{{ID: "every", Next: &next}}); err != nil || n != 1 {
		t.Fatalf("ack: %d %v", n, err)
	}
	info := inspect(t, s, "every")
	if info.State != store.StateScheduled || info.Message.Recur.N != 2 || !info.NextAt.Equal(next.DueAt) {
		t.Fatalf("next occurrence: %+v", info)
	}
	if ids, _ := s.GroupMembers(ctx, "g", 0); len(ids) != 1 {
		t.Fatalf("group: %v", ids)
	}
}

// Forecast counts by window, each window including the shorter ones.
func TestForecast(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 2)
	now := time.Now()
	park(t, s, store.Parked,
		msg("over", now.Add(-time.Second)),
		msg("m", now.Add(30*time.Second)),
		msg("f", now.Add(3*time.Minute)),
		msg("h", now.Add(30*time.Minute)),
		msg("d", now.Add(3*time.Hour)),
		msg("l", now.Add(48*time.Hour)))
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := store.Forecast{Minute: 2, FiveMinutes: 3, Hour: 4, Day: 5, Later: 1}
	if st.Forecast != want {
		t.Fatalf("forecast %+v, want %+v", st.Forecast, want)
	}
}

// ClaimAfter acks the previous lease's messages and claims in one call.
func TestClaimAfterAcksThenClaims(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 1, DedupeWindow: time.Minute})
	now := time.Now()
	park(t, s, store.Parked, msg("a", now.Add(-3*time.Millisecond)), msg("b", now.Add(-2*time.Millisecond)), msg("c", now.Add(-time.Millisecond)))
	first, err := s.Claim(ctx, 0, 1, time.Minute, nil)
	if err != nil || len(first.Messages) != 1 || first.Messages[0].ID != "a" {
		t.Fatalf("first claim: %+v %v", first, err)
	}
	next, err := s.ClaimAfter(ctx, first, []store.Done{{ID: "a", Origin: envelope.Origin{Log: "t/0", Pos: 1}}}, 5, time.Minute, nil)
	if err != nil || next.Acked != 1 || len(next.Messages) != 2 {
		t.Fatalf("claim after: acked %d, claimed %d, %v", next.Acked, len(next.Messages), err)
	}
	if _, err := s.Inspect(ctx, "a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the acked message is still known: %v", err)
	}
	if mark, _ := remembered(t, r.Client(), s, "a", "t/0"); mark != "1" {
		t.Fatal("the acked message is not remembered for the dedupe window")
	}
	// An ack under a lease that is gone acks nothing, and the claim happens.
	again, err := s.ClaimAfter(ctx, first, acks("b"), 5, time.Minute, nil)
	if err != nil || again.Acked != 0 {
		t.Fatalf("stale ack: acked %d, %v", again.Acked, err)
	}
}

// CommitAfter acks a lease's published messages and commits in one call:
// the acked one is gone and remembered for the dedupe window, the
// committed one is in flight, and an ack under a lease that is gone acks
// nothing while the commit still happens.
func TestCommitAfterAcksThenCommits(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 1, DedupeWindow: time.Minute})
	now := time.Now()
	park(t, s, store.Parked, msg("a", now.Add(-time.Millisecond)))
	first, err := s.Claim(ctx, 0, 1, time.Minute, nil)
	if err != nil || len(first.Messages) != 1 {
		t.Fatalf("first claim: %+v %v", first, err)
	}
	due := time.Now().Add(200 * time.Millisecond)
	park(t, s, store.Parked, msg("b", due), msg("c", due))
	ahead, err := s.ClaimAhead(ctx, 0, nil, nil, store.Ask{Max: 5, Lease: time.Minute, Ahead: 30 * time.Second})
	if err != nil || len(ahead.Messages) != 2 {
		t.Fatalf("claim ahead: %+v %v", ahead, err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return time.Now().After(due.Add(5 * time.Millisecond)) })
	_, res, acked, err := s.CommitAfter(ctx, ahead, ahead.Messages[:1], nil, first, []store.Done{{ID: "a", Origin: envelope.Origin{Log: "t/0", Pos: 1}}})
	if err != nil || acked != 1 || len(res) != 1 || res[0] != store.InFlight {
		t.Fatalf("commit after: acked %d, committed %v, %v; want 1 acked, in flight", acked, res, err)
	}
	if _, err := s.Inspect(ctx, "a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the acked message is still known: %v", err)
	}
	if mark, _ := remembered(t, r.Client(), s, "a", "t/0"); mark != "1" {
		t.Fatal("the acked message is not remembered for the dedupe window")
	}
	if info, err := s.Inspect(ctx, ahead.Messages[0].ID); err != nil || info.State != store.StateInflight {
		t.Fatalf("the committed message: %+v %v, want in flight", info, err)
	}
	_, res, acked, err = s.CommitAfter(ctx, ahead, ahead.Messages[1:], nil, first, acks("a"))
	if err != nil || acked != 0 || len(res) != 1 || res[0] != store.InFlight {
		t.Fatalf("stale ack: acked %d, committed %v, %v; want 0 acked, in flight", acked, res, err)
	}
	other := &store.Lease{Shard: 1, ExpiryMs: first.ExpiryMs}
	if _, _, _, err := s.CommitAfter(ctx, ahead, nil, nil, other, acks("a")); err == nil {
		t.Fatal("acks of another shard's lease were taken")
	}
}

// TestLeasesAreUnique: two claims of a shard never share a lease, however
// close in time (the second of two claims in the same millisecond got the
// first's lease, and an ack under the first took the second's messages:
// TestClaimAfterAcksThenClaims failed 13 of 20 runs on a quiet machine).
// So an ack, retry or dead-marking under a lease that is gone never
// touches a message claimed since.
func TestLeasesAreUnique(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	now := time.Now()
	var seen []int64
	for i := 0; i < 200; i++ {
		id := fmt.Sprint("m", i)
		park(t, s, store.Parked, msg(id, now.Add(-time.Second)))
		first, err := s.Claim(ctx, 0, 1, time.Minute, nil)
		if err != nil || len(first.Messages) != 1 {
			t.Fatalf("claim: %+v %v", first, err)
		}
		// Expire the first claim at once and claim the message again: the
		// same millisecond, most of the time.
		if _, err := s.Retry(ctx, first, []store.RetryAt{{ID: id, At: now.Add(-time.Second), Reason: "test"}}); err != nil {
			t.Fatal(err)
		}
		second, err := s.Claim(ctx, 0, 1, time.Minute, nil)
		if err != nil || len(second.Messages) != 1 {
			t.Fatalf("second claim: %+v %v", second, err)
		}
		if second.ExpiryMs <= first.ExpiryMs {
			t.Fatalf("claim %d: the second lease %d is not after the first %d", i, second.ExpiryMs, first.ExpiryMs)
		}
		for _, op := range []func() (int, error){
			func() (int, error) { return s.Ack(ctx, first, acks(id)) },
			func() (int, error) {
				return s.Retry(ctx, first, []store.RetryAt{{ID: id, At: now, Reason: "stale"}})
			},
			func() (int, error) { return s.MarkDead(ctx, first, []store.Failure{{ID: id, Reason: "stale"}}) },
		} {
			if n, err := op(); err != nil || n != 0 {
				t.Fatalf("claim %d: an op under the stale lease touched %d messages (%v)", i, n, err)
			}
		}
		if n, err := s.Ack(ctx, second, acks(id)); err != nil || n != 1 {
			t.Fatalf("claim %d: ack under the live lease: %d %v", i, n, err)
		}
		seen = append(seen, first.ExpiryMs, second.ExpiryMs)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] <= seen[i-1] {
			t.Fatalf("lease %d (%d) not after lease %d (%d)", i, seen[i], i-1, seen[i-1])
		}
	}
}

// TestAnEmptyClaimWritesNothing: a claim that finds nothing due writes
// nothing (an idle shard is claimed once per scheduler.max_sleep, and a
// write would go to the AOF each time), and the lease of the claim after
// it that takes a message still ends after the last one that took one.
func TestAnEmptyClaimWritesNothing(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 1, MaxDead: 10})
	keys := store.NewKeys("t")
	// Redis's count of changes to its data since the last save: what the
	// AOF and the replicas get.
	dirty := func() string {
		for _, line := range strings.Split(r.Client().Info(ctx, "persistence").Val(), "\r\n") {
			if v, ok := strings.CutPrefix(line, "rdb_changes_since_last_save:"); ok {
				return v
			}
		}
		t.Fatal("INFO persistence has no rdb_changes_since_last_save")
		return ""
	}
	// The first script a shard runs may record its layout (its marker, in
	// layout 2), once.
	if _, err := s.Claim(ctx, 0, 10, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	before := dirty()
	for i := 0; i < 3; i++ {
		c, err := s.Claim(ctx, 0, 10, time.Minute, nil)
		if err != nil || len(c.Messages) != 0 {
			t.Fatalf("claim of an empty shard: %+v %v", c, err)
		}
	}
	if after := dirty(); after != before {
		t.Fatalf("three empty claims changed Redis's data: %s changes before, %s after", before, after)
	}
	if n := r.Client().Exists(ctx, keys.Lease(0)).Val(); n != 0 {
		t.Fatalf("an empty claim wrote the shard's lease")
	}
	park(t, s, store.Parked, msg("a", time.Now().Add(-time.Second)))
	first, err := s.Claim(ctx, 0, 10, time.Minute, nil)
	if err != nil || len(first.Messages) != 1 {
		t.Fatalf("claim: %+v %v", first, err)
	}
	if _, err := s.Retry(ctx, first, []store.RetryAt{{ID: "a", At: time.Now().Add(-time.Second), Reason: "test"}}); err != nil {
		t.Fatal(err)
	}
	if c, err := s.Claim(ctx, 0, 10, time.Minute, nil); err != nil || len(c.Messages) != 1 || c.ExpiryMs <= first.ExpiryMs {
		t.Fatalf("the claim after a lease that took a message: %+v %v (first lease %d)", c, err, first.ExpiryMs)
	}
}

// TestFollowerOfAMessageInFlight: a new message with the ID of a message in
// flight (delivered, perhaps, and not acked yet: a Celery retry right after
// its task ran) is not dropped as known: it follows the version in flight
// and is parked once that one is acked or dead; a retry of the version in
// flight keeps it, and the follower waits on. A re-read of the version in
// flight is known, as is a second new message while one follows.
func TestFollowerOfAMessageInFlight(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	v := func(body string, pos uint64) *envelope.Message {
		m := msg("task", time.Now().Add(-time.Second))
		m.Body, m.Origin = []byte(body), envelope.Origin{Log: "q/0", Pos: pos}
		return m
	}
	park(t, s, store.Parked, v("run 1", 1))
	c, err := s.Claim(ctx, 0, 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 1 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	park(t, s, store.Known, v("run 1", 1)) // a re-read of the version in flight
	park(t, s, store.Queued, v("run 2", 2))
	park(t, s, store.Known, v("run 3", 3)) // one follower at a time
	// A retry keeps the version in flight; the follower waits on.
	if n, err := s.Retry(ctx, c, []store.RetryAt{{ID: "task", At: time.Now().Add(-time.Millisecond), Reason: "sink refused"}}); err != nil || n != 1 {
		t.Fatalf("retry: %d %v", n, err)
	}
	if body := string(inspect(t, s, "task").Message.Body); body != "run 1" {
		t.Fatalf("after the retry: %s", body)
	}
	if c, err = s.Claim(ctx, 0, 10, time.Minute, nil); err != nil || len(c.Messages) != 1 {
		t.Fatalf("claim again: %+v %v", c, err)
	}
	if n, err := s.Ack(ctx, c, acks("task")); err != nil || n != 1 {
		t.Fatalf("ack: %d %v", n, err)
	}
	info := inspect(t, s, "task")
	if string(info.Message.Body) != "run 2" || info.State != store.StateScheduled {
		t.Fatalf("after the ack: %s %s", info.Message.Body, info.State)
	}
	// Dead: the follower takes the place of the dead version.
	if c, err = s.Claim(ctx, 0, 10, time.Minute, nil); err != nil || len(c.Messages) != 1 {
		t.Fatalf("claim run 2: %+v %v", c, err)
	}
	park(t, s, store.Queued, v("run 3", 3))
	if n, err := s.MarkDead(ctx, c, []store.Failure{{ID: "task", Reason: "refused"}}); err != nil || n != 1 {
		t.Fatalf("dead: %d %v", n, err)
	}
	if info := inspect(t, s, "task"); string(info.Message.Body) != "run 3" || info.State != store.StateScheduled {
		t.Fatalf("after the death: %s %s", info.Message.Body, info.State)
	}
}

// TestRereadOfAnOlderVersionWhileTheNewerIsInFlight: the original of a
// replacement read again (a JetStream redelivery past ack_wait) while the
// replacement is in flight is a re-read, not a new message of the ID: a
// log is read in order, and it sits before the version in flight. Before,
// it followed the replacement and fired after it (64 of 1,000 pairs of
// TestReplacementInTheSameMillisecondWins with make test's load).
func TestRereadOfAnOlderVersionWhileTheNewerIsInFlight(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	v := func(body string, pos uint64, replace bool) *envelope.Message {
		m := msg("order", time.Now().Add(-time.Second))
		m.Body, m.Origin, m.Replace = []byte(body), envelope.Origin{Log: "ORDERS", Pos: pos}, replace
		return m
	}
	park(t, s, store.Parked, v("original", 1, false))
	park(t, s, store.Replaced, v("replacement", 2, true))
	c, err := s.Claim(ctx, 0, 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 1 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	park(t, s, store.Known, v("original", 1, false)) // read again
	if n, err := s.Ack(ctx, c, []store.Done{{ID: "order", Origin: c.Messages[0].Message.Origin}}); err != nil || n != 1 {
		t.Fatalf("ack: %d %v", n, err)
	}
	if info, err := s.Inspect(ctx, "order"); err == nil {
		t.Fatalf("after the replacement's ack %q is %s: the original read again follows it", info.Message.Body, info.State)
	}
}

// TestMaxSeries: limits.max_series bounds the live recurring series (a
// shard's share each): a new series past it is OverSeries and not parked;
// a series leaves the count when it ends, is cancelled or dies, and the
// count is Stats.Series.
func TestMaxSeries(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 1, MaxSeries: 3})
	series := func(id string) *envelope.Message {
		m := msg(id, time.Now().Add(-time.Millisecond))
		m.Recur = &envelope.Recurrence{Every: time.Minute, Anchor: m.DueAt, N: 1}
		return m
	}
	count := func(want int64) {
		t.Helper()
		st, err := s.Stats(ctx)
		if err != nil || st.Series != want {
			t.Fatalf("Stats.Series = %d (%v), want %d", st.Series, err, want)
		}
	}
	park(t, s, store.Parked, series("a"), series("b"), series("c"))
	park(t, s, store.OverSeries, series("d"))
	park(t, s, store.Known, series("a")) // the same series again: not a new one
	park(t, s, store.Parked, msg("one-shot", time.Now().Add(time.Hour)))
	count(3)
	if err := s.Cancel(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	count(2)
	park(t, s, store.Parked, series("d"))
	count(3)
	// Claim them all: the series of a ends, c dies, d goes on.
	c, err := s.Claim(ctx, 0, 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 3 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	next := *series("d")
	next.DueAt, next.Recur.N = next.DueAt.Add(time.Minute), 2
	if _, err := s.Ack(ctx, c, []store.Done{{ID: "a"}, {ID: "d", Next: &next}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MarkDead(ctx, c, []store.Failure{{ID: "c", Reason: "refused"}}); err != nil {
		t.Fatal(err)
	}
	count(1)
	park(t, s, store.Parked, series("e"), series("f"))
	park(t, s, store.OverSeries, series("g"))
	count(3)
}

// limits.max_series and ingest[].max_series bound the whole store, not
// each shard: with 16 shards and a bound of 3, the fourth new series is
// refused wherever its ID lands, in one call or one at a time, and a
// source's bound likewise.
func TestMaxSeriesIsTheWholeStores(t *testing.T) {
	ctx := context.Background()
	s := store.New(testenv.Redis(t).Client(), store.Options{Prefix: "t", Shards: 16, MaxSeries: 3,
		SourceSeries: map[string]int64{"noisy": 2}})
	series := func(id, src string) *envelope.Message {
		m := msg(id, time.Now().Add(time.Hour))
		m.Ingest = src
		m.Recur = &envelope.Recurrence{Every: time.Minute, Anchor: m.DueAt, N: 1}
		return m
	}
	var batch []*envelope.Message
	for i := range 8 {
		batch = append(batch, series(fmt.Sprintf("s%d", i), "calm"))
	}
	res, err := s.Park(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	parked := 0
	for i, r := range res {
		switch {
		case r == store.Parked:
			parked++
		case r != store.OverSeries:
			t.Fatalf("%s: %v", batch[i].ID, r)
		}
	}
	if parked != 3 {
		t.Fatalf("a call of 8 new series parked %d, want 3 (%v)", parked, res)
	}
	for i := range 8 {
		park(t, s, store.OverSeries, series(fmt.Sprintf("late%d", i), "calm"))
	}
	park(t, s, store.Known, batch[0]) // one of the three again: not a new series

	// A source's own bound, across the shards.
	other := store.New(testenv.Redis(t).Client(), store.Options{Prefix: "u", Shards: 16, SourceSeries: map[string]int64{"noisy": 2}})
	for i := range 2 {
		park(t, other, store.Parked, series(fmt.Sprintf("n%d", i), "noisy"))
	}
	for i := 2; i < 10; i++ {
		park(t, other, store.OverSourceSeries, series(fmt.Sprintf("n%d", i), "noisy"))
	}
	park(t, other, store.Parked, series("calm-one", "calm"))
	st, err := other.Stats(ctx)
	if err != nil || st.Series != 3 {
		t.Fatalf("series %d (%v), want 3", st.Series, err)
	}

	// Calls at once on one shard, far under the bound, each park theirs
	// (each counted the shard before the other's series joined).
	roomy := store.New(testenv.Redis(t).Client(), store.Options{Prefix: "v", Shards: 16, MaxSeries: 1000})
	var ids []string
	for i := 0; len(ids) < 40; i++ {
		if id := fmt.Sprintf("same-%d", i); roomy.ShardOf(id) == 0 {
			ids = append(ids, id)
		}
	}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			if res, err := roomy.Park(ctx, []*envelope.Message{series(id, "calm")}); err != nil || res[0] != store.Parked {
				t.Errorf("park %s at once with others on its shard: %v %v", id, res, err)
			}
		})
	}
	wg.Wait()
}

// TestRetryDeadAsMaxSeries: a dead recurring message retried is a live
// series again, under the rule Park applies to a new one: past the shard's
// share of limits.max_series it is ErrOverSeries and stays dead; a one-shot
// is retried whatever the count; once a series ends, the retry goes through.
func TestRetryDeadAsMaxSeries(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 1, MaxSeries: 2})
	series := func(id string) *envelope.Message {
		m := msg(id, time.Now().Add(-time.Millisecond))
		m.Recur = &envelope.Recurrence{Every: time.Minute, Anchor: m.DueAt, N: 1}
		return m
	}
	count := func(want int64) {
		t.Helper()
		st, err := s.Stats(ctx)
		if err != nil || st.Series != want {
			t.Fatalf("Stats.Series = %d (%v), want %d", st.Series, err, want)
		}
	}
	park(t, s, store.Parked, series("a"), series("b"))
	c, err := s.Claim(ctx, 0, 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 2 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	if n, err := s.MarkDead(ctx, c, []store.Failure{{ID: "b", Reason: "refused"}}); err != nil || n != 1 {
		t.Fatalf("dead: %d %v", n, err)
	}
	count(1)
	park(t, s, store.Parked, series("c"))
	count(2)
	if _, err := s.Reject(ctx, []store.Rejected{{Message: msg("one-shot", time.Now()), Reason: "x-delay is empty"}}); err != nil {
		t.Fatal(err)
	}

	if err := s.RetryDeadAs(ctx, series("b")); !errors.Is(err, store.ErrOverSeries) {
		t.Fatalf("retry of a series past max_series: %v, want ErrOverSeries", err)
	}
	if info := inspect(t, s, "b"); info.State != store.StateDead || info.Reason != "refused" {
		t.Fatalf("after the refused retry: %s %q", info.State, info.Reason)
	}
	count(2)
	if err := s.RetryDeadAs(ctx, msg("one-shot", time.Now())); err != nil {
		t.Fatalf("retry of a one-shot at max_series: %v", err)
	}
	count(2)

	if err := s.Cancel(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if err := s.RetryDeadAs(ctx, series("b")); err != nil {
		t.Fatalf("retry once a series ended: %v", err)
	}
	if info := inspect(t, s, "b"); info.State != store.StateScheduled {
		t.Fatalf("after the retry: %s", info.State)
	}
	count(2)
}

// An ID known as another source's message (another ingest, or the admin
// API) is neither a duplicate of it nor its to replace: IDTaken, and the
// known message is left as it was.
func TestIDTakenAcrossSources(t *testing.T) {
	s := newStore(t, 2)
	due := time.Now().Add(time.Hour)
	of := func(ingest, body string, replace bool) *envelope.Message {
		m := msg("order-1", due)
		m.Ingest, m.Body, m.Replace = ingest, []byte(body), replace
		return m
	}
	park(t, s, store.Parked, of("orders", "v1", false))
	park(t, s, store.IDTaken, of("payments", "squat", false))
	park(t, s, store.IDTaken, of("payments", "squat", true))
	park(t, s, store.IDTaken, of("", "by the API", true))
	park(t, s, store.Known, of("orders", "v1 again", false))
	park(t, s, store.Replaced, of("orders", "v2", true))
	if got := string(inspect(t, s, "order-1").Message.Body); got != "v2" {
		t.Fatalf("body %q, want v2: only the same ingest replaces", got)
	}
}
