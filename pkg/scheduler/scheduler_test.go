package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/natsbroker"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/lifecycle"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/sinks"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// fakeClock is a manual clock. Every NewTimer is announced on timers, so a
// test waits for the scheduler to go to sleep instead of sleeping itself.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	pending []*fakeTimer
	timers  chan time.Duration
	created int // timers made so far: a fakeTimer's seq is its rank
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.UnixMilli(1_700_000_000_000), timers: make(chan time.Duration, 100)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	c.created++
	t := &fakeTimer{c: make(chan time.Time, 1), at: c.now.Add(d), clock: c, seq: c.created}
	c.pending = append(c.pending, t)
	c.mu.Unlock()
	c.timers <- d
	return t
}

// Advance moves time and fires the timers that are due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	keep := c.pending[:0]
	for _, t := range c.pending {
		if !t.at.After(c.now) {
			t.c <- c.now
		} else {
			keep = append(keep, t)
		}
	}
	c.pending = keep
}

type fakeTimer struct {
	c     chan time.Time
	at    time.Time
	clock *fakeClock
	seq   int
}

// made is how many timers have been made so far.
func (c *fakeClock) made() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.created
}

// waiting reports whether a timer made after the first `since` is pending
// and ends within d of now, so that Advance(d) fires it.
func (c *fakeClock) waiting(since int, d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.pending {
		if t.seq > since && !t.at.After(c.now.Add(d)) {
			return true
		}
	}
	return false
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }
func (t *fakeTimer) Stop() bool {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	for i, p := range t.clock.pending {
		if p == t {
			t.clock.pending = append(t.clock.pending[:i], t.clock.pending[i+1:]...)
			return true
		}
	}
	return false
}

// fakeStore is an in-memory model of the store on one shard, on the fake
// clock. It records every settle call.
type fakeStore struct {
	mu      sync.Mutex
	clock   *fakeClock
	scores  map[string]time.Time
	msgs    map[string]*envelope.Message
	corrupt map[string]bool
	attempt map[string]int
	skew    time.Duration // Redis's clock minus the scheduler's

	held     map[string]time.Time // held for a sink: the score it had
	paused   map[string]bool
	bands    map[string]int             // the hold band of each sink SinkStates named
	unsure   map[string]bool            // Settlement.Unconfirmed
	others   map[string]store.SinkState // sinks in Redis that the scheduler does not configure
	nextSlot time.Time
	slots    map[string]time.Time // the slot each deferred message waits for
	holds    chan store.Unavailable

	acked     chan string
	retried   chan store.RetryAt
	postponed chan store.RetryAt
	dead      chan store.Failure
	claims    chan int // messages per claim
	// settledAt is the fake clock's count of timers made (fakeClock.made)
	// at the last Ack, Postpone or Retry: the shard's sleep after it is a
	// timer made later.
	settledAt int
	// stall, when set, is how long the next claim that takes a message
	// keeps the claimer (a process paused between its claim and its
	// publish): the clock moves on by it before the claim returns.
	stall time.Duration
	// lookHold, when set, keeps every Occupied until it is closed, as
	// go-redis keeps a read past its context's deadline.
	lookHold chan struct{}
	// claimErr, when set, is what every claim answers; claimsFailed
	// counts them.
	claimErr     error
	claimsFailed int
}

func newFakeStore(c *fakeClock) *fakeStore {
	return &fakeStore{
		clock: c, scores: map[string]time.Time{}, msgs: map[string]*envelope.Message{},
		corrupt: map[string]bool{}, attempt: map[string]int{}, held: map[string]time.Time{}, paused: map[string]bool{}, slots: map[string]time.Time{},
		bands: map[string]int{}, others: map[string]store.SinkState{}, unsure: map[string]bool{},
		holds: make(chan store.Unavailable, 1000),
		acked: make(chan string, 1000), retried: make(chan store.RetryAt, 1000), postponed: make(chan store.RetryAt, 1000),
		dead: make(chan store.Failure, 1000), claims: make(chan int, 1000),
	}
}

func (f *fakeStore) park(id string, due time.Time, sink string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scores[id] = due
	f.msgs[id] = &envelope.Message{ID: id, DueAt: due, Sink: sink, Destination: "dest", Body: []byte(id)}
}

func (f *fakeStore) Shards() int        { return 1 }
func (f *fakeStore) ShardOf(string) int { return 0 }

func (f *fakeStore) Claim(_ context.Context, shard, max int, lease time.Duration, blocked map[string]int) (*store.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock.Now()
	ids := make([]string, 0, len(f.scores))
	for id := range f.scores {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return f.scores[ids[i]].Before(f.scores[ids[j]]) })
	c := &store.Lease{Shard: shard, Now: now.Add(f.skew), ExpiryMs: now.Add(f.skew + lease).UnixMilli()}
	for _, id := range ids {
		if f.scores[id].After(now) || len(c.Messages) == max {
			continue
		}
		if _, ok := blocked[f.msgs[id].Sink]; ok {
			f.held[id] = f.scores[id]
			delete(f.scores, id)
			continue
		}
		f.attempt[id]++
		f.scores[id] = now.Add(lease)
		m := store.Claimed{ID: id, Attempt: f.attempt[id], Message: f.msgs[id], Slot: f.slots[id], Sent: f.unsure[id]}
		delete(f.slots, id)
		if f.corrupt[id] {
			m.Message, m.Err = nil, envelope.ErrCorrupt
		}
		c.Messages = append(c.Messages, m)
	}
	for _, s := range f.scores {
		if c.Next.IsZero() || s.Before(c.Next) {
			c.Next = s
		}
	}
	if f.stall > 0 && len(c.Messages) > 0 {
		f.clock.Advance(f.stall)
		f.stall = 0
	}
	f.claims <- len(c.Messages)
	return c, nil
}

func (f *fakeStore) Ack(_ context.Context, _ *store.Lease, ds []store.Done) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range ds {
		delete(f.scores, d.ID)
		if d.Next != nil {
			f.scores[d.ID] = d.Next.DueAt
			f.msgs[d.ID] = d.Next
		}
		f.settledAt = f.clock.made()
		f.acked <- d.ID
	}
	return len(ds), nil
}

// ClaimAhead acks and claims; the model claims only what is due (claims
// ahead are tested against Redis, in pkg/store and test/e2e).
func (f *fakeStore) ClaimAhead(ctx context.Context, shard int, prev *store.Lease, ds []store.Done, ask store.Ask) (*store.Lease, error) {
	f.mu.Lock()
	if err := f.claimErr; err != nil {
		f.claimsFailed++
		f.mu.Unlock()
		return nil, err
	}
	f.mu.Unlock()
	n := 0
	if len(ds) > 0 {
		n, _ = f.Ack(ctx, prev, ds)
	}
	c, err := f.Claim(ctx, shard, ask.Max, ask.Lease, ask.Blocked)
	if c != nil {
		c.Acked = n
	}
	return c, err
}

func (f *fakeStore) Node(context.Context, int) string { return "" }

func (f *fakeStore) CommitAfter(context.Context, *store.Lease, []store.Claimed, []store.Claimed, *store.Lease, []store.Done) (time.Time, []store.Committed, int, error) {
	return time.Time{}, nil, 0, errors.New("fakeStore: nothing is claimed ahead")
}

func (f *fakeStore) CommitLead() time.Duration { return store.DefaultCommitLead }

func (f *fakeStore) Hold(_ context.Context, _ *store.Lease, us []store.Unavailable) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, u := range us {
		f.held[u.ID] = f.scores[u.ID]
		delete(f.scores, u.ID)
		f.holds <- u
	}
	return len(us), nil
}

func (f *fakeStore) Defer(_ context.Context, _ *store.Lease, slots []store.Slot) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, sl := range slots {
		f.scores[sl.ID] = sl.At
		f.slots[sl.ID] = sl.At
	}
	return len(slots), nil
}

func (f *fakeStore) Postpone(_ context.Context, _ *store.Lease, rs []store.RetryAt) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range rs {
		f.scores[r.ID] = r.At
		f.attempt[r.ID]-- // not counted: the next claim is the same attempt
		f.settledAt = f.clock.made()
		f.postponed <- r
	}
	return len(rs), nil
}

// Occupied: the fake's one shard holds something when a message has a
// score (held ones have none).
func (f *fakeStore) Occupied(_ context.Context, shards []int) ([]bool, error) {
	f.mu.Lock()
	hold := f.lookHold
	f.mu.Unlock()
	if hold != nil {
		<-hold
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]bool, len(shards))
	for i := range shards {
		out[i] = len(f.scores) > 0
	}
	return out, nil
}

func (f *fakeStore) ReleaseAll(_ context.Context, band, _ int) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for id := range f.held {
		if b, ok := f.bands[f.msgs[id].Sink]; !ok || b != band {
			continue
		}
		f.scores[id] = f.msgs[id].DueAt
		delete(f.held, id)
		n++
	}
	return n, nil
}

func (f *fakeStore) Slots(_ context.Context, _ string, n int, rate float64) (time.Time, []time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock.Now().Add(f.skew)
	if f.nextSlot.Before(now) {
		f.nextSlot = now
	}
	slots := make([]time.Time, n)
	for i := range slots {
		slots[i] = f.nextSlot
		f.nextSlot = f.nextSlot.Add(time.Duration(float64(time.Second) / rate))
	}
	return now, slots, nil
}

func (f *fakeStore) SinkStates(_ context.Context, names []string) (map[string]store.SinkState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]store.SinkState{}
	for i, n := range names {
		out[n] = store.SinkState{Band: i, Paused: f.paused[n]}
		f.bands[n] = i
	}
	for n, st := range f.others {
		out[n] = st
		f.bands[n] = st.Band
	}
	return out, nil
}

func (f *fakeStore) Retry(_ context.Context, _ *store.Lease, rs []store.RetryAt) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range rs {
		f.scores[r.ID] = r.At
		f.settledAt = f.clock.made()
		f.retried <- r
	}
	return len(rs), nil
}

// Settle writes each settlement as the store's script does: acks,
// retries, deaths, then what is put back (held, deferred, postponed).
func (f *fakeStore) Settle(ctx context.Context, sts []store.Settlement) ([]store.Settled, []error) {
	out, errs := make([]store.Settled, len(sts)), make([]error, len(sts))
	for i, st := range sts {
		f.mu.Lock() // before the outcomes, which a test waits for
		for _, id := range st.Unconfirmed {
			f.unsure[id] = true
		}
		f.mu.Unlock()
		out[i].Acked, _ = f.Ack(ctx, st.Lease, st.Done)
		out[i].Retried, _ = f.Retry(ctx, st.Lease, st.Retry)
		out[i].Dead, _ = f.MarkDead(ctx, st.Lease, st.Dead)
		h, _ := f.Hold(ctx, st.Lease, st.Hold)
		d, _ := f.Defer(ctx, st.Lease, st.Defer)
		p, _ := f.Postpone(ctx, st.Lease, st.Postpone)
		out[i].PutBack = h + d + p
	}
	return out, errs
}

func (f *fakeStore) MarkDead(_ context.Context, _ *store.Lease, ds []store.Failure) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range ds {
		delete(f.scores, d.ID)
		f.dead <- d
	}
	return len(ds), nil
}

// fakeSink records publishes; fail decides the error of each message.
type fakeSink struct {
	mu        sync.Mutex
	published []sinks.Outgoing
	fail      func(m sinks.Outgoing) error
	// sent and apart count, by ID, every publish and those marked
	// sinks.WithApart.
	sent, apart map[string]int
}

func (s *fakeSink) Publish(ctx context.Context, msgs []sinks.Outgoing) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sent == nil {
		s.sent, s.apart = map[string]int{}, map[string]int{}
	}
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		s.sent[m.ID]++
		if sinks.IsApart(ctx) {
			s.apart[m.ID]++
		}
		if s.fail != nil {
			errs[i] = s.fail(m)
		}
		if errs[i] == nil {
			s.published = append(s.published, m)
		}
	}
	return errs
}

func (s *fakeSink) Close() error { return nil }

type harness struct {
	clock *fakeClock
	store *fakeStore
	sink  *fakeSink
	sched *Scheduler
	stop  func()
	// wrapSink, set by a test's setup, gives the scheduler another sink
	// around the fake one.
	wrapSink func(*fakeSink) sinks.Sink
}

// answeringSink is a fake sink whose broker answers a probe.
type answeringSink struct{ *fakeSink }

func (answeringSink) Probe(context.Context) error { return nil }

func start(t *testing.T, p Params, setup func(*harness)) *harness {
	t.Helper()
	h := &harness{clock: newFakeClock(), sink: &fakeSink{}}
	h.store = newFakeStore(h.clock)
	if setup != nil {
		setup(h)
	}
	p.Store = h.store
	if p.Sinks == nil {
		var sk sinks.Sink = h.sink
		if h.wrapSink != nil {
			sk = h.wrapSink(h.sink)
		}
		p.Sinks = map[string]sinks.Sink{"s": sk}
	}
	p.Clock = h.clock
	p.Metrics = metrics.New()
	p.Rand = func() float64 { return 0.5 } // no jitter
	withDefaults(&p)
	h.sched = New(p)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.sched.Run(ctx); close(done) }()
	h.stop = func() { cancel(); <-done }
	t.Cleanup(h.stop)
	return h
}

func recv[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestSleepsUntilTheEarliestDueMessage(t *testing.T) {
	h := start(t, Params{MaxSleep: time.Minute}, func(h *harness) {
		h.store.park("a", h.clock.Now().Add(5*time.Second), "s")
	})
	recv(t, h.store.claims, "first claim")
	if d := recv(t, h.clock.timers, "sleep"); d != 5*time.Second {
		t.Fatalf("slept %v, want 5s (until the due time)", d)
	}
	h.clock.Advance(5 * time.Second)
	if n := recv(t, h.store.claims, "claim at due time"); n != 1 {
		t.Fatalf("claimed %d, want 1", n)
	}
	if id := recv(t, h.store.acked, "ack"); id != "a" {
		t.Fatalf("acked %s", id)
	}
	if len(h.sink.published) != 1 || h.sink.published[0].Attempt != 1 {
		t.Fatalf("published %+v", h.sink.published)
	}
}

func TestSleepIsBoundedByMaxSleep(t *testing.T) {
	h := start(t, Params{MaxSleep: 2 * time.Second}, func(h *harness) {
		h.store.park("far", h.clock.Now().Add(time.Hour), "s")
	})
	recv(t, h.store.claims, "claim")
	if d := recv(t, h.clock.timers, "sleep"); d != 2*time.Second {
		t.Fatalf("slept %v, want max_sleep 2s", d)
	}
	h.clock.Advance(2 * time.Second)
	recv(t, h.store.claims, "claim after max_sleep")
}

// An empty shard does not claim again each max_sleep: it sleeps
// emptyClaimEvery of them, and lookEmpty (each max_sleep, on the wall
// clock) wakes it as soon as the store holds something for it that came
// without a Notify (parked by another instance).
func TestEmptyShardIsWatchedNotClaimed(t *testing.T) {
	const maxSleep = 20 * time.Millisecond
	h := start(t, Params{MaxSleep: maxSleep}, nil)
	recv(t, h.store.claims, "first claim")
	if d := recv(t, h.clock.timers, "sleep"); d != emptyClaimEvery*maxSleep {
		t.Fatalf("an empty shard slept %v, want %v", d, emptyClaimEvery*maxSleep)
	}
	h.store.park("other", h.clock.Now(), "s") // the fake clock stands still: only lookEmpty can wake the shard
	if n := recv(t, h.store.claims, "the claim lookEmpty wakes"); n != 1 {
		t.Fatalf("the woken claim took %d messages", n)
	}
	if id := recv(t, h.store.acked, "ack"); id != "other" {
		t.Fatalf("acked %s", id)
	}
}

// A look at the empty shards that outlasts max_sleep (a Redis Cluster node
// that does not answer holds up the look's one pipeline, and go-redis ends
// the read at redis.read_timeout, not at the look's deadline) wakes them
// each max_sleep, to claim on their own as they would without the look: a
// message parked meanwhile is claimed though the look never answers.
func TestSlowLookWakesTheEmptyShards(t *testing.T) {
	const maxSleep = 20 * time.Millisecond
	hold := make(chan struct{})
	h := start(t, Params{MaxSleep: maxSleep}, func(h *harness) { h.store.lookHold = hold })
	t.Cleanup(func() { close(hold) }) // before the scheduler's stop, which waits for the look
	recv(t, h.store.claims, "first claim")
	if d := recv(t, h.clock.timers, "sleep"); d != emptyClaimEvery*maxSleep {
		t.Fatalf("an empty shard slept %v, want %v", d, emptyClaimEvery*maxSleep)
	}
	// The fake clock stands still, and the look never answers: a claim
	// now is a late look's wake-up, and so is the one after the park.
	if n := recv(t, h.store.claims, "a claim a late look wakes"); n != 0 {
		t.Fatalf("the empty shard's claim took %d messages", n)
	}
	h.store.park("other", h.clock.Now(), "s")
	deadline := time.Now().Add(5 * time.Second)
	for recv(t, h.store.claims, "a claim a slow look wakes") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the slow look's wake-ups never claimed the message parked meanwhile")
		}
	}
}

func TestNotifyWakesEarlyOnlyForSoonerMessages(t *testing.T) {
	h := start(t, Params{MaxSleep: time.Minute}, func(h *harness) {
		h.store.park("later", h.clock.Now().Add(30*time.Second), "s")
	})
	recv(t, h.store.claims, "claim")
	recv(t, h.clock.timers, "sleep")

	// A message due after the planned wake-up does not wake the shard.
	h.sched.Notify("x", h.clock.Now().Add(45*time.Second))
	select {
	case <-h.store.claims:
		t.Fatal("woke for a message due later than planned")
	default:
	}
	// One due sooner does.
	h.store.park("soon", h.clock.Now().Add(time.Second), "s")
	h.sched.Notify("soon", h.clock.Now().Add(time.Second))
	recv(t, h.store.claims, "claim after notify")
	if d := recv(t, h.clock.timers, "sleep after notify"); d != time.Second {
		t.Fatalf("slept %v, want 1s", d)
	}
}

func TestFullBatchClaimsAgainAtOnce(t *testing.T) {
	h := start(t, Params{BatchSize: 2, MaxSleep: time.Minute}, func(h *harness) {
		for _, id := range []string{"a", "b", "c", "d", "e"} {
			h.store.park(id, h.clock.Now().Add(-time.Second), "s")
		}
	})
	for _, want := range []int{2, 2, 1} {
		if n := recv(t, h.store.claims, "claim"); n != want {
			t.Fatalf("claimed %d, want %d", n, want)
		}
	}
	recv(t, h.clock.timers, "sleep once drained")
	for i := 0; i < 5; i++ {
		recv(t, h.store.acked, "ack")
	}
}

func TestFailedPublishBacksOffThenDies(t *testing.T) {
	boom := sinks.Rejected(errors.New("unroutable")) // the broker attributes it to the message: it counts
	h := start(t, Params{MaxAttempts: 3, MaxSleep: time.Hour,
		Backoff: lifecycle.Backoff{Min: time.Second, Max: time.Minute, Multiplier: 2}}, func(h *harness) {
		h.sink.fail = func(sinks.Outgoing) error { return boom }
		h.store.park("m", h.clock.Now(), "s")
	})
	for attempt, wantDelay := range []time.Duration{time.Second, 2 * time.Second} {
		r := recv(t, h.store.retried, "retry")
		if got := r.At.Sub(h.clock.Now()); got != wantDelay {
			t.Fatalf("attempt %d: back-off %v, want %v", attempt+1, got, wantDelay)
		}
		if r.Reason != "unroutable" {
			t.Fatalf("reason %q", r.Reason)
		}
		recv(t, h.clock.timers, "sleep until retry")
		h.clock.Advance(wantDelay)
	}
	d := recv(t, h.store.dead, "dead after max attempts")
	if d.ID != "m" || !strings.Contains(d.Reason, "3 times") || !strings.Contains(d.Reason, "unroutable") {
		t.Fatalf("dead = %+v", d)
	}
}

func TestPermanentErrorsAndCorruptMessagesDieAtOnce(t *testing.T) {
	h := start(t, Params{MaxAttempts: 10}, func(h *harness) {
		h.sink.fail = func(m sinks.Outgoing) error {
			if m.ID == "perm" {
				return sinks.Permanent(errors.New("not a subject"))
			}
			return nil
		}
		h.store.park("perm", h.clock.Now(), "s")
		h.store.park("corrupt", h.clock.Now(), "s")
		h.store.corrupt["corrupt"] = true
		h.store.park("ok", h.clock.Now(), "s")
	})
	got := map[string]string{}
	for i := 0; i < 2; i++ {
		d := recv(t, h.store.dead, "dead")
		got[d.ID] = d.Reason
	}
	if !strings.Contains(got["perm"], "not a subject") || !strings.Contains(got["corrupt"], "decode") {
		t.Fatalf("dead reasons = %v", got)
	}
	if id := recv(t, h.store.acked, "ack"); id != "ok" {
		t.Fatalf("acked %s", id)
	}
}

// TestRefusedDestinationNeverPublished: a message parked for a control
// plane subject (by an older version, or any path that forgot the check)
// is dead before it reaches the sink (Params.Destinations).
func TestRefusedDestinationNeverPublished(t *testing.T) {
	h := start(t, Params{MaxAttempts: 10, Destinations: func(m *envelope.Message) error {
		return natsbroker.Destinations.Check(m.Destination, nil, false)
	}}, func(h *harness) {
		h.store.park("api", h.clock.Now(), "s")
		h.store.msgs["api"].Destination = "$JS.API.STREAM.DELETE.VICTIM"
		h.store.park("ok", h.clock.Now(), "s")
	})
	d := recv(t, h.store.dead, "dead")
	if d.ID != "api" || !strings.Contains(d.Reason, `begins with "$"`) {
		t.Fatalf("dead %s: %q", d.ID, d.Reason)
	}
	if id := recv(t, h.store.acked, "ack"); id != "ok" {
		t.Fatalf("acked %s", id)
	}
	h.sink.mu.Lock()
	defer h.sink.mu.Unlock()
	for _, m := range h.sink.published {
		if m.ID == "api" {
			t.Fatalf("published to %s", m.Destination)
		}
	}
}

func TestUnknownSinkIsRetried(t *testing.T) {
	h := start(t, Params{MaxAttempts: 5}, func(h *harness) {
		h.store.park("m", h.clock.Now(), "gone")
	})
	r := recv(t, h.store.retried, "retry")
	if !strings.Contains(r.Reason, `sink "gone" is not configured`) {
		t.Fatalf("reason %q", r.Reason)
	}
}

// A message held for a sink no instance configures any more (removed from
// the configuration while it was down) is released and fails as not
// configured, as a parked one does, instead of waiting for ever; one held
// for such a sink that is paused stays held.
func TestHeldForAnUnconfiguredSinkIsReleased(t *testing.T) {
	h := start(t, Params{MaxAttempts: 5, MaxSleep: 20 * time.Millisecond}, func(h *harness) {
		h.store.others["gone"] = store.SinkState{Band: 7}
		h.store.others["stopped"] = store.SinkState{Band: 8, Paused: true}
		for id, sink := range map[string]string{"g": "gone", "p": "stopped"} {
			h.store.park(id, h.clock.Now(), sink)
			h.store.held[id] = h.clock.Now()
			delete(h.store.scores, id)
		}
	})
	var r store.RetryAt
	testenv.Eventually(t, 10*time.Second, func() bool {
		h.clock.Advance(20 * time.Millisecond)
		select {
		case r = <-h.store.retried:
			return true
		default:
			return false
		}
	}, "the message held for the unconfigured sink claimed")
	if r.ID != "g" || !strings.Contains(r.Reason, `sink "gone" is not configured`) {
		t.Fatalf("retried %s: %q", r.ID, r.Reason)
	}
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	if _, held := h.store.held["p"]; !held {
		t.Fatal("the message of the paused sink was released")
	}
}

func TestLatePolicyDeadAndDeadLetterCopies(t *testing.T) {
	dlq := &fakeSink{}
	h := start(t, Params{MaxLateness: time.Minute, LateDead: true,
		DeadLetter: &sinks.DeadLetter{Sink: dlq, Destination: "dead.letters"}}, func(h *harness) {
		h.store.park("late", h.clock.Now().Add(-2*time.Minute), "s")
		h.store.park("fine", h.clock.Now().Add(-30*time.Second), "s")
	})
	d := recv(t, h.store.dead, "dead")
	if d.ID != "late" || !strings.Contains(d.Reason, "late") || !strings.Contains(d.Reason, "max_lateness") {
		t.Fatalf("dead = %+v", d)
	}
	if id := recv(t, h.store.acked, "ack"); id != "fine" {
		t.Fatalf("acked %s", id)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { dlq.mu.Lock(); defer dlq.mu.Unlock(); return len(dlq.published) == 1 })
	dlq.mu.Lock()
	defer dlq.mu.Unlock()
	c := dlq.published[0]
	if c.ID != "late" || c.Destination != "dead.letters" {
		t.Fatalf("copy %+v", c.Message)
	}
	if r, _ := c.OutHeaders(c.Attempt).Get(sinks.HeaderDeadReason); !strings.Contains(r, "late") {
		t.Fatalf("copy reason %q", r)
	}
	h.sink.mu.Lock()
	defer h.sink.mu.Unlock()
	for _, p := range h.sink.published {
		if p.ID == "late" {
			t.Fatal("a late message was published under late_policy dead")
		}
	}
}

// Retry times are due scores, so they are in Redis's clock, whatever the
// skew of the daemon's.
func TestRetryTimesAreInRedisTime(t *testing.T) {
	h := start(t, Params{MaxAttempts: 5, Backoff: lifecycle.Backoff{Min: time.Second, Max: time.Minute, Multiplier: 2}}, func(h *harness) {
		h.store.skew = 10 * time.Minute
		h.sink.fail = func(sinks.Outgoing) error { return sinks.Rejected(errors.New("unroutable")) }
		h.store.park("m", h.clock.Now(), "s")
	})
	r := recv(t, h.store.retried, "retry")
	if got := r.At.Sub(h.clock.Now()); got != 10*time.Minute+time.Second {
		t.Fatalf("retry at our clock + %v, want + 10m1s (Redis time + back-off)", got)
	}
}

// withDefaults fills the zero fields of p with the configuration's defaults.
// A lease is a fence: a claimer that comes back from a pause with less
// than LeaseMargin of its lease left (here: past it) publishes nothing of
// it; the message is put back at its due time, its attempt not counted,
// and published once the next claim takes it.
func TestPausePastTheLeasePublishesNothing(t *testing.T) {
	for _, stall := range []time.Duration{config.DefaultLease, config.DefaultLease - config.DefaultLeaseMargin(config.DefaultLease)} {
		t.Run(stall.String(), func(t *testing.T) {
			h := start(t, Params{MaxSleep: time.Minute}, func(h *harness) {
				h.store.park("m", h.clock.Now(), "s")
				h.store.stall = stall
			})
			recv(t, h.store.claims, "the stalled claim")
			r := recv(t, h.store.postponed, "the fenced message put back")
			if r.ID != "m" || !strings.Contains(r.Reason, "lease_margin") {
				t.Fatalf("put back %+v", r)
			}
			if id := recv(t, h.store.acked, "ack after the next claim"); id != "m" {
				t.Fatalf("acked %s", id)
			}
			if len(h.sink.published) != 1 || h.sink.published[0].Attempt != 1 {
				t.Fatalf("published %+v, want once, as attempt 1", h.sink.published)
			}
		})
	}
	// A pause that leaves more than the margin publishes at once.
	h := start(t, Params{MaxSleep: time.Minute}, func(h *harness) {
		h.store.park("m", h.clock.Now(), "s")
		h.store.stall = config.DefaultLease - config.DefaultLeaseMargin(config.DefaultLease) - time.Millisecond
	})
	if id := recv(t, h.store.acked, "ack"); id != "m" || len(h.store.postponed) != 0 {
		t.Fatalf("acked %s, %d put back", id, len(h.store.postponed))
	}
}

// fenceSink publishes the first message of a batch, then waits (polling,
// with a deadline) until the publish may begin no more (sinks.Expired):
// a sink whose confirms come slowly, one message at a time. It records
// what each call published and what stopped it.
type fenceSink struct {
	mu    sync.Mutex
	calls [][]string
	stops []error
}

func (s *fenceSink) Publish(ctx context.Context, msgs []sinks.Outgoing) []error {
	errs := make([]error, len(msgs))
	var sent []string
	var stop error
	for i, m := range msgs {
		if i == 1 {
			testenv.Poll(10*time.Second, func() bool { return sinks.Expired(ctx) != nil })
		}
		if err := sinks.Expired(ctx); err != nil {
			stop = err
			errs[i] = fmt.Errorf("not sent: %w", err)
			continue
		}
		sent = append(sent, m.ID)
	}
	s.mu.Lock()
	s.calls, s.stops = append(s.calls, sent), append(s.stops, stop)
	s.mu.Unlock()
	return errs
}

func (s *fenceSink) Close() error { return nil }

// A batch sent one message at a time sends none from the fence on (the
// lease's last lease_margin): the ones left are put back, not counted, and
// claimed again, as a batch that could not start.
func TestNoMessageOfABatchBeginsPastTheFence(t *testing.T) {
	sink := &fenceSink{}
	h := start(t, Params{MaxSleep: time.Minute, Lease: 2 * time.Second, LeaseMargin: time.Second, Sinks: map[string]sinks.Sink{"s": sink}},
		func(h *harness) {
			h.store.park("a", h.clock.Now(), "s")
			h.store.park("b", h.clock.Now(), "s")
		})
	r := recv(t, h.store.postponed, "the message left put back")
	if !strings.Contains(r.Reason, "lease_margin") {
		t.Fatalf("put back %+v, want fenced", r)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	// The first publish: one sent, then stopped at the fence (the one put
	// back is claimed again and published by a later one).
	if len(sink.calls) == 0 || len(sink.calls[0]) != 1 || sink.calls[0][0] == r.ID || !errors.Is(sink.stops[0], sinks.ErrSendBy) {
		t.Fatalf("publishes %v stopped by %v, put back %s: want the first to send one and stop at the fence", sink.calls, sink.stops, r.ID)
	}
}

// A publish that returns past its lease's end counts as fenced whatever
// bounded it: a sink that took longer than its context (here the clock
// passes the lease inside the publish, the publish timeout being the
// shorter bound) leaves the message to whoever claims it next, put back
// uncounted and marked unconfirmed, not retried as this claim's.
func TestPublishReturningPastTheLeaseIsFenced(t *testing.T) {
	var once sync.Once
	h := start(t, Params{MaxSleep: time.Minute}, func(h *harness) {
		h.sink.fail = func(o sinks.Outgoing) error {
			err := error(nil)
			once.Do(func() {
				h.clock.Advance(config.DefaultLease)
				err = fmt.Errorf("no PubAck: %w", context.DeadlineExceeded)
			})
			return err
		}
		h.store.park("m", h.clock.Now(), "s")
	})
	if r := recv(t, h.store.postponed, "the message put back"); r.ID != "m" {
		t.Fatalf("put back %+v", r)
	}
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	if !h.store.unsure["m"] {
		t.Error("the message sent past its lease is not marked unconfirmed")
	}
}

func withDefaults(p *Params) {
	config.Default(&p.BatchSize, config.DefaultBatchSize)
	config.Default(&p.Lease, config.DefaultLease)
	config.Default(&p.LeaseMargin, config.DefaultLeaseMargin(p.Lease))
	config.Default(&p.MaxSleep, config.DefaultMaxSleep)
	config.Default(&p.PublishTimeout, config.DefaultPublishTimeout)
	config.Default(&p.MaxAttempts, config.DefaultMaxAttempts)
	config.Default(&p.RepeatInterval, config.DefaultLogRepeatInterval)
	config.Default(&p.Backoff, lifecycle.Backoff{Min: config.DefaultBackoffInitial, Max: config.DefaultBackoffMax,
		Multiplier: config.DefaultBackoffMultiplier, Jitter: config.DefaultBackoffJitter})
	config.Default(&p.DrainTimeout, config.DefaultShutdownTimeout)
}

// A publish sent and not confirmed in time may reach the broker all the
// same: the message is put back marked unconfirmed (a cancel then meets it
// as in flight), whether its sink is held for it or it is tried again; a
// publish the broker refused, or one never begun past the fence, is not.
func TestTimedOutPublishIsUnconfirmed(t *testing.T) {
	h := start(t, Params{MaxAttempts: 5, MaxSleep: 20 * time.Millisecond}, func(h *harness) {
		h.sink.fail = func(o sinks.Outgoing) error {
			switch o.Message.ID {
			case "timeout":
				return fmt.Errorf("nats: no PubAck for %s: %w", o.Message.ID, context.DeadlineExceeded)
			case "refused":
				return sinks.Rejected(errors.New("no stream for the subject"))
			}
			return nil
		}
		h.store.park("timeout", h.clock.Now(), "s")
		h.store.park("refused", h.clock.Now(), "s")
	})
	for range 2 {
		select {
		case <-h.store.holds:
		case <-h.store.retried:
		case <-time.After(10 * time.Second):
			t.Fatal("no outcome for both messages")
		}
	}
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	if !h.store.unsure["timeout"] || h.store.unsure["refused"] {
		t.Fatalf("unconfirmed %v, want timeout alone", h.store.unsure)
	}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{sinks.Because(sinks.ReasonTimeout, errors.New("no confirm")), true},
		{sinks.Again(errors.New("closed among many")), true},
		{sinks.Sent(errors.New("no publisher confirm, the connection lost")), true},
		{errFenced, false},
		{&fencedSentError{err: "no PubAck"}, true},                      // sent, not confirmed within the lease
		{sinks.Sent(fmt.Errorf("not sent: %w", sinks.ErrSendBy)), true}, // sent before, not again past the fence
		{fmt.Errorf("publish: %w", sinks.ErrSendBy), false},
		{sinks.NotSent(fmt.Errorf("not sent: %w", context.DeadlineExceeded)), false},
		{sinks.NotSent(errors.New("not sent: 16384 PubAcks awaited")), false},
		{sinks.Rejected(errors.New("unroutable")), false},
		{errors.New("nats: connection closed"), false},
		{nil, false},
	} {
		if got := maybeSent(c.err); got != c.want {
			t.Errorf("maybeSent(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	// Claimed again first like any fenced publish, and no destination's
	// stall: the lease ended, not the publish timeout.
	if fs := error(&fencedSentError{err: "timeout"}); !errors.Is(fs, errFenced) || timedOut(fs) || publishReason(fs) != sinks.ReasonTimeout {
		t.Errorf("fencedSentError: fenced %v, timed out %v, reason %s", errors.Is(fs, errFenced), timedOut(fs), publishReason(fs))
	}
}

// A publish that fails because the sink is unavailable is not the
// message's fault: the message is held without counting an attempt, past
// max_attempts as long as the sink stays down, and delivered once it is back.
func TestUnavailableSinkHoldsWithoutCountingAttempts(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	h := start(t, Params{MaxAttempts: 1, MaxSleep: 20 * time.Millisecond}, func(h *harness) {
		h.sink.fail = func(sinks.Outgoing) error {
			if down.Load() {
				return errors.New("nats: connection closed")
			}
			return nil
		}
		h.store.park("m", h.clock.Now(), "s")
	})
	u := recv(t, h.store.holds, "held")
	if u.ID != "m" || !u.DueAt.Equal(h.clock.Now()) {
		t.Fatalf("held %+v", u)
	}
	select {
	case d := <-h.store.dead:
		t.Fatalf("dead although the sink was down: %+v", d)
	case r := <-h.store.retried:
		t.Fatalf("retried (attempt counted) although the sink was down: %+v", r)
	default:
	}
	down.Store(false)
	// The gate's back-off passes on the injected clock; its refresh (on the
	// wall clock, every MaxSleep) then releases the message, which fires.
	testenv.Eventually(t, 10*time.Second, func() bool {
		h.clock.Advance(time.Second)
		select {
		case id := <-h.store.acked:
			return id == "m"
		default:
			return false
		}
	}, "the held message delivered after the sink came back")
}

// A publish the sink could not decide (sinks.Again), or one it did not
// send (sinks.NotSent: its bound of publishes awaiting an answer full, or
// the publish's time over before its turn), is put back for a little
// later without counting an attempt, and the sink is not held: the other
// message of the batch, to the same sink, is delivered. One not sent is
// not marked unconfirmed (nothing was sent, so a cancel is honoured) nor
// its destination taken for stalled: a timeout of the same kind was both
// before NotSent.
func TestPutBackUncountedNotHeld(t *testing.T) {
	for _, c := range []struct {
		name   string
		err    error
		unsure bool
	}{
		{"undecided", sinks.Again(errors.New("the broker closed the channel; not probed")), true},
		{"unsent", sinks.NotSent(fmt.Errorf("nats sink s: not sent: %w", context.DeadlineExceeded)), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := start(t, Params{MaxAttempts: 1, MaxSleep: 20 * time.Millisecond}, func(h *harness) {
				h.sink.fail = func(m sinks.Outgoing) error {
					if m.ID == c.name {
						return c.err
					}
					return nil
				}
				h.store.park(c.name, h.clock.Now(), "s")
				h.store.park("fine", h.clock.Now(), "s")
			})
			r := recv(t, h.store.postponed, "the message put back")
			if r.ID != c.name || !r.At.After(h.clock.Now()) {
				t.Fatalf("put back %+v, want %s a little later", r, c.name)
			}
			if id := recv(t, h.store.acked, "the other message delivered"); id != "fine" {
				t.Fatalf("acked %s, want fine", id)
			}
			noHoldNorAttempt(t, h)
			h.store.mu.Lock()
			defer h.store.mu.Unlock()
			if h.store.unsure[c.name] != c.unsure {
				t.Errorf("marked unconfirmed: %v, want %v", h.store.unsure[c.name], c.unsure)
			}
			if !c.unsure && h.sched.stalls.suspect("s", "dest") {
				t.Errorf("its destination is taken for stalled")
			}
		})
	}
}

// noHoldNorAttempt fails the test if the harness's store has held a
// message (the sink taken for down) or counted an attempt of one.
func noHoldNorAttempt(t *testing.T, h *harness) {
	t.Helper()
	select {
	case u := <-h.store.holds:
		t.Fatalf("held %+v: the sink was taken for down", u)
	case d := <-h.store.dead:
		t.Fatalf("dead %+v: an attempt was counted", d)
	case rt := <-h.store.retried:
		t.Fatalf("retried %+v: an attempt was counted", rt)
	default:
	}
}

// A message whose destination is down for now (sinks.Down: a JetStream
// stream without its leader, while the sink's other streams answer) is
// put back without counting an attempt, without holding the sink and
// without an unconfirmed mark (nothing was stored), for about as long
// again as it has waited, up to the block of a sink down.
func TestDestinationDownIsPutBackByHowLongItWaited(t *testing.T) {
	var now time.Time
	h := start(t, Params{MaxAttempts: 1, MaxSleep: 20 * time.Millisecond}, func(h *harness) {
		h.sink.fail = func(m sinks.Outgoing) error {
			if m.ID != "fine" {
				return sinks.Down(errors.New("nats sink s: the stream that stores \"dest\" does not answer"))
			}
			return nil
		}
		now = h.clock.Now()
		h.store.park("fresh", now, "s")
		h.store.park("late", now.Add(-40*time.Second), "s")
		h.store.park("a-little", now.Add(-3*time.Second), "s")
		h.store.park("fine", now, "s")
	})
	got := map[string]time.Time{}
	for range 3 {
		r := recv(t, h.store.postponed, "a message of the destination down put back")
		got[r.ID] = r.At
	}
	if d := got["fresh"].Sub(now); d <= 0 || d > time.Second {
		t.Errorf("the message due now put back %s later, want the back-off's first step (0.5 s)", d)
	}
	if d := got["a-little"].Sub(now); d < 2*time.Second || d > 8*time.Second {
		t.Errorf("the message 3 s late put back %s later, want about as long again", d)
	}
	if d := got["late"].Sub(now); d < 20*time.Second || d > 30*time.Second {
		t.Errorf("the message 40 s late put back %s later, want about as long again, at most 30 s", d)
	}
	if id := recv(t, h.store.acked, "the other message delivered"); id != "fine" {
		t.Fatalf("acked %s, want fine", id)
	}
	noHoldNorAttempt(t, h)
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	if h.store.unsure["fresh"] || h.store.unsure["late"] || h.store.unsure["a-little"] {
		t.Errorf("marked unconfirmed: %v; nothing was stored", h.store.unsure)
	}
}

// A paused sink's messages are held, not published, until it is resumed.
func TestPausedSinkHolds(t *testing.T) {
	h := start(t, Params{MaxSleep: 20 * time.Millisecond}, func(h *harness) {
		h.store.paused["s"] = true
	})
	h.store.park("p", h.clock.Now(), "s")
	h.sched.Notify("p", h.clock.Now())
	testenv.Eventually(t, 10*time.Second, func() bool {
		h.store.mu.Lock()
		defer h.store.mu.Unlock()
		_, held := h.store.held["p"]
		return held
	}, "the paused sink's message held")
	if n := len(h.sink.published); n != 0 {
		t.Fatalf("published %d to a paused sink", n)
	}
	h.store.mu.Lock()
	h.store.paused["s"] = false
	h.store.mu.Unlock()
	testenv.Eventually(t, 10*time.Second, func() bool {
		h.clock.Advance(time.Millisecond)
		select {
		case <-h.store.acked:
			return true
		default:
			return false
		}
	}, "delivered after resume")
}

// A recurring message's ack carries its next occurrence, due on the
// schedule however late this one fired.
func TestRecurringAckParksTheNext(t *testing.T) {
	h := start(t, Params{MaxSleep: time.Hour}, func(h *harness) {
		due := h.clock.Now()
		h.store.park("r", due, "s")
		h.store.msgs["r"].Recur = &envelope.Recurrence{Every: time.Second, Anchor: due, N: 1, Missed: envelope.MissedAll}
	})
	recv(t, h.store.acked, "first occurrence")
	h.store.mu.Lock()
	next := h.store.msgs["r"]
	h.store.mu.Unlock()
	if next.Recur.N != 2 || !next.DueAt.Equal(next.Recur.Anchor.Add(time.Second)) {
		t.Fatalf("next occurrence #%d due %v", next.Recur.N, next.DueAt)
	}
	h.sink.mu.Lock()
	out := h.sink.published[0].OutHeaders(1)
	h.sink.mu.Unlock()
	if v, _ := out.Get(envelope.HeaderOccurrence); v != "1" {
		t.Fatalf("x-delaybridge-occurrence %q", v)
	}
	// The shard sleeps until the occurrence it parked is due, not until the
	// lease of the first ends or MaxSleep (an hour here) passes.
	if d := recv(t, h.clock.timers, "sleep"); d != time.Second {
		t.Fatalf("slept %v, want 1s (until the next occurrence)", d)
	}
	h.clock.Advance(time.Second)
	recv(t, h.store.acked, "second occurrence at its due time")
}

// max_rate: messages beyond the slots that have come wait for theirs.
func TestMaxRateDefers(t *testing.T) {
	h := start(t, Params{MaxSleep: time.Hour, MaxRates: map[string]float64{"s": 10}}, func(h *harness) {
		for i := range 5 {
			h.store.park(fmt.Sprintf("t%d", i), h.clock.Now(), "s")
		}
	})
	recv(t, h.store.acked, "the first slot's message")
	h.store.mu.Lock()
	waiting := 0
	for _, at := range h.store.scores {
		if at.After(h.clock.Now()) {
			waiting++
		}
	}
	h.store.mu.Unlock()
	if waiting != 4 {
		t.Fatalf("%d messages wait for a slot, want 4 (one slot per 100 ms at 10/s)", waiting)
	}
}

// max_rate after every instance was down: the messages whose slots passed
// meanwhile take new ones, and go at the rate, not all at once.
func TestMaxRateSlotsPassedUnusedAreAllottedAgain(t *testing.T) {
	h := start(t, Params{MaxSleep: time.Hour, MaxRates: map[string]float64{"s": 10}}, func(h *harness) {
		// Five messages that waited for slots 100 ms apart, the last 9 s
		// before this instance began: no instance ran since.
		for i := range 5 {
			id := fmt.Sprintf("t%d", i)
			slot := h.clock.Now().Add(-10*time.Second + time.Duration(i)*100*time.Millisecond)
			h.store.park(id, slot.Add(-time.Minute), "s")
			h.store.scores[id], h.store.slots[id] = slot, slot
		}
	})
	recv(t, h.store.acked, "one message at once")
	waiting := func() (n int) {
		h.store.mu.Lock()
		defer h.store.mu.Unlock()
		for _, at := range h.store.scores {
			if at.After(h.clock.Now()) {
				n++
			}
		}
		return n
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return waiting() == 4 }, "four messages waiting for new slots")
	select {
	case id := <-h.store.acked:
		t.Fatalf("%s published at once too: the slots that passed were used together", id)
	default:
	}
}

// A slot is stale, and allotted again, only when it passed well before the
// claimer began: one that passed while it ran (a claim late behind a
// backlog, however late) is used, or a claimer that stays late would put
// every message behind newer ones at each claim and publish nothing.
func TestStaleSlot(t *testing.T) {
	since := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		slot  time.Time
		since time.Time
		want  bool
	}{
		{since.Add(-10 * time.Second), since, true},             // passed while no instance ran
		{since.Add(-slotGrace - time.Millisecond), since, true}, // just past the grace
		{since.Add(-slotGrace / 2), since, false},               // within the grace: a second's worth at most
		{since.Add(time.Second), since, false},                  // passed while it ran, claimed late
		{since.Add(-time.Hour), time.Time{}, false},             // before the first claim: nothing known
	} {
		if got := staleSlot(c.slot, c.since); got != c.want {
			t.Errorf("staleSlot(%v before the first claim) = %v, want %v", c.since.Sub(c.slot), got, c.want)
		}
	}
}

// An occurrence of a series sent before without a confirmation (a publish
// that timed out while its broker stalled) is published again when it is
// claimed, however late, never skipped as a missed one under route.missed
// skip: its broker may have the first copy, and the series must not go on
// past it (publishing the next ones into the same stall) until it is
// confirmed.
func TestUnconfirmedOccurrenceIsNotSkipped(t *testing.T) {
	h := start(t, Params{MaxSleep: time.Hour}, func(h *harness) {
		now := h.clock.Now()
		due := now.Add(-5 * time.Second) // four occurrences of the series due since
		h.store.park("m", due, "s")
		h.store.msgs["m"].Recur = &envelope.Recurrence{Every: time.Second, Anchor: due, N: 1, Missed: envelope.MissedSkip, Parked: due.Add(-time.Minute)}
		h.store.unsure["m"] = true
	})
	if id := recv(t, h.store.acked, "the occurrence"); id != "m" {
		t.Fatalf("acked %s", id)
	}
	h.sink.mu.Lock()
	defer h.sink.mu.Unlock()
	if len(h.sink.published) != 1 || h.sink.published[0].Message.Recur.N != 1 {
		t.Fatalf("published %d messages, want occurrence 1 again", len(h.sink.published))
	}
}

// Settled waits for a publish this instance runs apart (past its grace):
// a cancel of that message answers once it is settled (here: delivered, so
// unknown), not at once while it is still in flight.
func TestSettledWaitsForAPublishApart(t *testing.T) {
	release, publishing := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := start(t, Params{MaxSleep: time.Hour}, func(h *harness) {
		h.sink.fail = func(o sinks.Outgoing) error {
			once.Do(func() { close(publishing) })
			<-release
			return nil
		}
		h.store.park("m", h.clock.Now(), "s")
	})
	var released sync.Once
	unblock := func() { released.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the harness stops, on a failure
	<-publishing
	testenv.Eventually(t, 10*time.Second, func() bool { _, ok := h.sched.apart.Load("m"); return ok }, "the publish left to run apart")
	// While it runs, Settled waits until its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	h.sched.Settled(ctx, "m")
	if ctx.Err() == nil {
		t.Fatal("Settled returned while the publish apart was under way")
	}
	unblock()
	recv(t, h.store.acked, "the ack of the publish apart")
	testenv.Eventually(t, 10*time.Second, func() bool { _, ok := h.sched.apart.Load("m"); return !ok }, "the publish apart forgotten once settled")
}

// TestStallingDestination: a destination that does not answer while its
// sink confirms other messages (docs/reference.md: one destination that never
// answers") does not block the sink: its message is postponed without
// counting an attempt, then, from the stallAttempts-th timeout in a row,
// counts, and ends dead after max_attempts with the reason; the messages to
// other destinations are confirmed, once each. (The first timeout comes in
// the publish that confirms another message; the later ones, published
// apart, find the sink's broker answering a probe.)
func TestStallingDestination(t *testing.T) {
	stalled := fmt.Errorf("nats sink s: no PubAck: %w", context.DeadlineExceeded)
	h := start(t, Params{MaxAttempts: 4, MaxSleep: time.Hour,
		Backoff: lifecycle.Backoff{Min: time.Second, Max: time.Second, Multiplier: 1}}, func(h *harness) {
		h.wrapSink = func(s *fakeSink) sinks.Sink { return answeringSink{s} }
		h.sink.fail = func(m sinks.Outgoing) error {
			if m.Destination == "stuck" {
				return stalled
			}
			return nil
		}
		h.store.park("stuck", h.clock.Now(), "s")
		h.store.msgs["stuck"].Destination = "stuck"
		h.store.park("ok", h.clock.Now(), "s")
	})
	if id := recv(t, h.store.acked, "ack of the other destination"); id != "ok" {
		t.Fatalf("acked %s", id)
	}
	for i := 1; i < stallAttempts; i++ {
		p := recv(t, h.store.postponed, "postponed stall")
		if p.ID != "stuck" || !strings.Contains(p.Reason, "did not answer") {
			t.Fatalf("postponed %+v", p)
		}
		h.store.park(fmt.Sprint("ok", i), h.clock.Now(), "s") // the sink takes others meanwhile
		h.sched.Notify(fmt.Sprint("ok", i), h.clock.Now())
		if id := recv(t, h.store.acked, "ack while the destination stalls"); id != fmt.Sprint("ok", i) {
			t.Fatalf("acked %s", id)
		}
		sleepsUntil(t, h, time.Second)
		h.clock.Advance(time.Second)
	}
	for {
		select {
		case r := <-h.store.retried:
			if r.ID != "stuck" || !strings.Contains(r.Reason, "did not answer") {
				t.Fatalf("retried %+v", r)
			}
			sleepsUntil(t, h, time.Second)
			h.clock.Advance(time.Second)
			continue
		case d := <-h.store.dead:
			if d.ID != "stuck" || !strings.Contains(d.Reason, "4 times") || !strings.Contains(d.Reason, "did not answer") {
				t.Fatalf("dead %+v", d)
			}
		case u := <-h.store.holds:
			t.Fatalf("held %+v: a stalling destination blocked its sink", u)
		case <-time.After(5 * time.Second):
			t.Fatal("the stalling message did not end dead")
		}
		break
	}
	h.sink.mu.Lock()
	defer h.sink.mu.Unlock()
	seen := map[string]int{}
	for _, m := range h.sink.published {
		seen[m.ID]++
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s published %d times", id, n)
		}
	}
	// The sink is told which publishes go apart (a RabbitMQ sink puts
	// them on a connection of their own): the stalling destination's
	// after its first timeout, never the others'.
	if n, apart := h.sink.sent["stuck"], h.sink.apart["stuck"]; n < 2 || apart != n-1 {
		t.Errorf("the stalling message: published %d times, %d of them marked apart; want all but the first", n, apart)
	}
	for id := range seen {
		if h.sink.apart[id] > 0 {
			t.Errorf("%s, to a destination that answers, published apart %d times", id, h.sink.apart[id])
		}
	}
}

// sleepsUntil waits until the shard, after the store's last settle call,
// goes to sleep for at most d (the time of a retry), so that advancing the
// clock by d wakes it. A sleep from before that call does not count: the
// shard may have left it already and not yet begun the next, which an
// Advance made meanwhile would not wake (it failed so beside make test's
// other jobs).
func sleepsUntil(t *testing.T, h *harness, d time.Duration) {
	t.Helper()
	h.store.mu.Lock()
	since := h.store.settledAt
	h.store.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for !h.clock.waiting(since, d) {
		if time.Now().After(deadline) {
			t.Fatalf("the shard did not go to sleep for at most %v within 5s", d)
		}
		select {
		case <-h.clock.timers: // read, so that NewTimer never blocks on a full channel
		case <-time.After(time.Millisecond):
		}
	}
}

// nodeStore spreads the fake's shards over named Redis nodes.
type nodeStore struct {
	*fakeStore
	nodes []string // by shard
}

func (n nodeStore) Shards() int                              { return len(n.nodes) }
func (n nodeStore) Node(_ context.Context, shard int) string { return n.nodes[shard] }

// At most claimsPerNode shards claim from one Redis node at once, and a
// node's turns are its own: a full node does not stop a claim from another.
func TestClaimsTakeTurnsPerNode(t *testing.T) {
	p := Params{Store: nodeStore{newFakeStore(newFakeClock()), []string{"a", "a", "a", "b"}}}
	withDefaults(&p)
	s := New(p)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	var dones []func()
	for range claimsPerNode {
		done, ok := s.claimTurn(context.Background(), 0)
		if !ok {
			t.Fatal("a turn of a free node was refused")
		}
		dones = append(dones, done)
	}
	// The node is full: a claim waits, here until its context ends. (With
	// a free turn select would pick either case: 20 tries.)
	for range 20 {
		if _, ok := s.claimTurn(ended, 1); ok {
			t.Fatalf("shard 1 got a turn while %d shards of its node claimed", claimsPerNode)
		}
	}
	done, ok := s.claimTurn(context.Background(), 3)
	if !ok {
		t.Fatal("node b's shard waited for node a's turns")
	}
	done()
	dones[0]()
	turned := make(chan bool)
	go func() {
		done, ok := s.claimTurn(context.Background(), 2)
		if ok {
			done()
		}
		turned <- ok
	}()
	if !recv(t, turned, "a turn given back") {
		t.Fatal("a turn given back was not taken")
	}
	dones[1]()
}

// A shard's publisher runs a publish at once whether it is idle or busy:
// one left running (a stalled destination) never holds the next, which
// runs on a goroutine of its own; once idle again it takes the next one.
func TestPublisherNeverMakesAPublishWait(t *testing.T) {
	p := newPublisher()
	defer p.stop()
	release := make(chan struct{})
	stuck := make(chan struct{})
	p.run(func() { close(stuck); <-release }) // busy until released
	<-stuck
	ran := make(chan struct{})
	p.run(func() { close(ran) })
	recv(t, ran, "a publish while the publisher was busy")
	close(release)
	testenv.Eventually(t, 10*time.Second, p.idle.Load, "the publisher is not idle after its job")
	started, block := make(chan struct{}), make(chan struct{})
	p.run(func() { close(started); <-block })
	recv(t, started, "a publish once the publisher was idle again")
	if p.idle.Load() {
		t.Fatal("the idle publisher did not take the publish: it ran on a goroutine of its own")
	}
	close(block)
}
