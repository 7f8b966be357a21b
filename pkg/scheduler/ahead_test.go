package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/sinks"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// The floor of Redis's clock never runs ahead of it, whatever the round
// trips it saw: replies with Redis's reading at any point of their round
// trip, a clock that runs slower than ours by the drift allowed, one set
// back, and another Redis (a shard moved).
func TestRedisFloorNeverAhead(t *testing.T) {
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC) // our clock
	type reply struct {
		sent, read, answered time.Duration // our clock, from base
	}
	cases := []struct {
		name    string
		offset  time.Duration // Redis's clock minus ours at base
		rate    float64       // Redis's clock runs at this rate of ours
		replies []reply
	}{
		{"read at once", 3 * time.Millisecond, 1, []reply{{0, 0, 400 * time.Microsecond}, {time.Millisecond, 1001 * time.Microsecond, 1300 * time.Microsecond}}},
		{"read at the end", -5 * time.Millisecond, 1, []reply{{0, 400 * time.Microsecond, 400 * time.Microsecond}, {time.Millisecond, 1300 * time.Microsecond, 1300 * time.Microsecond}}},
		{"slower by the drift", 0, 1 - maxDrift, []reply{{0, 10 * time.Microsecond, 20 * time.Microsecond}, {time.Second, time.Second + 10*time.Microsecond, time.Second + 20*time.Microsecond}}},
	}
	for _, c := range cases {
		redisAt := func(d time.Duration) time.Time {
			return base.Add(c.offset).Add(time.Duration(float64(d) * c.rate))
		}
		var f redisFloor
		for _, r := range c.replies {
			f.observe(redisAt(r.read), base.Add(r.sent), base.Add(r.answered))
			for _, ahead := range []time.Duration{0, 100 * time.Microsecond, 2 * time.Millisecond, time.Second} {
				due := redisAt(r.answered).Add(ahead)
				at := f.local(due) // when we would publish
				if got := redisAt(at.Sub(base)); got.Before(due) {
					t.Errorf("%s: due %v, published at Redis's %v: %v early", c.name, due, got, due.Sub(got))
				}
			}
		}
	}

	// A Redis whose clock is behind the floor (set back, or another one):
	// the floor starts again from it.
	var f redisFloor
	f.observe(base, base.Add(-time.Millisecond), base)
	back := base.Add(-time.Second) // read after we sent at base+1ms
	f.observe(back, base.Add(time.Millisecond), base.Add(2*time.Millisecond))
	if got := f.local(back.Add(time.Millisecond)); got.Before(base.Add(3 * time.Millisecond)) {
		t.Errorf("after Redis's clock went back a second, a message due 1 ms after its reading is published at %v, before our %v", got, base.Add(3*time.Millisecond))
	}
	// One that says less than the floor leaves it: the floor is the most
	// any reply says.
	var g redisFloor
	g.observe(base, base.Add(-100*time.Microsecond), base)
	g.observe(base.Add(time.Millisecond), base.Add(500*time.Microsecond), base.Add(1500*time.Microsecond))
	if got, want := g.local(base.Add(2*time.Millisecond)), base.Add(2*time.Millisecond); got.Sub(want) > 10*time.Microsecond {
		t.Errorf("the floor took the reply that says less: a message due at our +2ms (Redis's clock = ours) is published at +%v", got.Sub(base))
	}
}

// The acks of a message published at its instant ride with the shard's
// next commit, a moment later, instead of a call of their own: on a real
// Redis, twenty messages 20 ms apart, all claimed ahead at once, are each
// published once and gone from Redis, with a settle call of their own
// only for the last (nothing comes after it) where each had one before.
func TestAcksRideWithTheNextCommit(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	calls := map[string]int{}
	st := store.New(testenv.Redis(t).Client(), store.Options{Prefix: "r", Shards: 1, Observe: func(op string, _ time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			calls[op]++
		}
	}})
	const n = 20
	first := time.Now().Add(500 * time.Millisecond)
	var msgs []*envelope.Message
	for i := range n {
		msgs = append(msgs, &envelope.Message{ID: fmt.Sprintf("m%02d", i), DueAt: first.Add(time.Duration(i) * 20 * time.Millisecond).Truncate(time.Millisecond),
			Sink: "s", Destination: "out", Ingest: "in", IngestedAt: time.Now(), Body: []byte("x")})
	}
	if _, err := st.Park(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	sink := &fakeSink{}
	_, stop := runAhead(st, sink)
	defer stop()
	testenv.Eventually(t, 30*time.Second, func() bool {
		s, err := st.Stats(ctx)
		return err == nil && s.Parked == 0
	}, "the messages were not all acked")
	stop()
	sink.mu.Lock()
	published := len(sink.published)
	sink.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if published != n {
		t.Fatalf("published %d messages, want each of the %d once", published, n)
	}
	if calls["commit"] < n/2 {
		t.Fatalf("%d commits for %d messages 20 ms apart: %v", calls["commit"], n, calls)
	}
	if calls["settle"] > 3 {
		t.Fatalf("%d settle calls of their own for %d messages, want the acks to ride with the commits: %v", calls["settle"], n, calls)
	}
}

// A message its sink confirmed is delivered, not in flight, to whoever asks
// this instance, even while its ack waits to ride with the shard's next
// commit: Settled writes the acks this instance holds (or waits for the
// publish under way) so that a cancel right after the consumer got the
// message answers "unknown", as for any delivered message, not "in
// flight". On a real Redis, two messages 40 ms apart on one shard, both
// claimed ahead: the first one's ack would ride with the second's commit.
func TestADeliveredMessageIsNotInFlight(t *testing.T) {
	ctx := context.Background()
	st := store.New(testenv.Redis(t).Client(), store.Options{Prefix: "d", Shards: 1})
	first := time.Now().Add(500 * time.Millisecond).Truncate(time.Millisecond)
	var msgs []*envelope.Message
	for i := range 2 {
		msgs = append(msgs, &envelope.Message{ID: fmt.Sprintf("m%d", i), DueAt: first.Add(time.Duration(i) * 40 * time.Millisecond),
			Sink: "s", Destination: "out", Ingest: "in", IngestedAt: time.Now(), Body: []byte("x")})
	}
	if _, err := st.Park(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	sent := make(chan struct{}, 1)
	sink := &fakeSink{fail: func(m sinks.Outgoing) error {
		if m.ID == "m0" {
			sent <- struct{}{}
		}
		return nil
	}}
	sched, stop := runAhead(st, sink)
	defer stop()
	select {
	case <-sent:
	case <-time.After(30 * time.Second):
		t.Fatal("m0 was not published")
	}
	waitCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	sched.Settled(waitCtx, "m0") // at once when the ack already rode with m1's commit
	if err := st.Cancel(ctx, "m0"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("cancel of a delivered message: %v, want store.ErrNotFound", err)
	}
}

// runAhead runs a scheduler on the real store st with sink "s", claiming
// 2 s ahead; stop ends it and waits for it, and may be called again.
func runAhead(st *store.Store, sink sinks.Sink) (sched *Scheduler, stop func()) {
	p := Params{Store: st, Sinks: map[string]sinks.Sink{"s": sink}, Metrics: metrics.New(), Ahead: 2 * time.Second, MaxSleep: 100 * time.Millisecond}
	withDefaults(&p)
	sched = New(p)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = sched.Run(ctx); close(done) }()
	return sched, sync.OnceFunc(func() { cancel(); <-done })
}
