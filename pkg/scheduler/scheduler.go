// Package scheduler fires parked messages when they are due.
//
// One goroutine per shard claims due messages from Redis (store.Claim),
// publishes them to their sinks, and then acks them (removes them from
// Redis), reschedules them with back-off, or moves them to the dead set.
// Between claims it sleeps until the shard's earliest score, as reported by
// the claim itself in Redis server time, never longer than MaxSleep (so that
// messages parked by other instances are seen) and no longer than it takes
// for a message parked by this process to come due (Notify wakes it). A
// shard its claim found empty sleeps longer, and one look at Redis for all
// the empty shards each MaxSleep wakes those that hold something
// (lookEmpty).
//
// Delivery is at least once: a message leaves Redis only after its sink
// confirmed it. If this process dies holding a claim, the claim's lease
// expires and any instance claims the message again.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/lifecycle"
	"github.com/delaybridge/delaybridge/pkg/logrepeat"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/sinks"
	"github.com/delaybridge/delaybridge/pkg/store"
	"github.com/delaybridge/delaybridge/pkg/tracing"
)

// Store is the part of the store the scheduler needs (*store.Store): the
// claim and what settles a lease, and the sinks' shared state.
type Store interface {
	Shards() int
	ShardOf(id string) int
	ClaimAhead(ctx context.Context, shard int, prev *store.Lease, ds []store.Done, ask store.Ask) (*store.Lease, error)
	// Node names the Redis node that serves the shard now ("" when there
	// is one), for claimsPerNode.
	Node(ctx context.Context, shard int) string
	// CommitAfter acks the messages ds of the shard's lease prev (none:
	// nil), then puts the messages commit of lease l, claimed ahead, in
	// flight and gives back the messages back, in one call.
	CommitAfter(ctx context.Context, l *store.Lease, commit, back []store.Claimed, prev *store.Lease, ds []store.Done) (time.Time, []store.Committed, int, error)
	CommitLead() time.Duration
	// Settle writes every outcome of a batch of a lease (delivered,
	// retried, dead, held, deferred to a rate slot, postponed) in one
	// call, acting only on the messages still under that lease; a
	// settlement whose error is set wrote nothing and may be given again.
	Settle(ctx context.Context, sts []store.Settlement) ([]store.Settled, []error)
	// ReleaseAll moves every held message of the sink with hold band band
	// back to its due time, in every shard, at most max per call to Redis,
	// and returns how many.
	ReleaseAll(ctx context.Context, band, max int) (int, error)
	// Occupied reports, for each of shards, whether a claim could take
	// anything there now or later (held messages aside).
	Occupied(ctx context.Context, shards []int) ([]bool, error)
	Slots(ctx context.Context, sink string, n int, maxRate float64) (time.Time, []time.Time, error)
	SinkStates(ctx context.Context, names []string) (map[string]store.SinkState, error)
}

// Params configure a Scheduler.
type Params struct {
	Store Store
	Sinks map[string]sinks.Sink

	// The values of the scheduler: section (config.Scheduler), which has
	// their defaults; New panics on a zero one.
	BatchSize      int               // most messages per claim
	Lease          time.Duration     // how long a claim holds its messages
	LeaseMargin    time.Duration     // a publish starts only with this much of its lease left (fence)
	MaxSleep       time.Duration     // longest sleep without a claim
	PublishTimeout time.Duration     // bound of one publish
	MaxAttempts    int               // publishes before a message is dead
	Backoff        lifecycle.Backoff // between attempts (its Delay)
	// RepeatInterval (log.repeat_interval, required) is how often at most
	// a failed publish, a dead message or a stalled destination is logged
	// per sink and destination; the repeats are counted (failures).
	RepeatInterval time.Duration
	// Ahead, when positive, claims what falls due within it ahead of time
	// and publishes it at its due instant after a commit (see loop).
	Ahead time.Duration
	// MaxLateness, when positive with LateDead, makes a message claimed
	// more than this after its due time dead (reason "late") instead of
	// published.
	MaxLateness time.Duration
	LateDead    bool
	// Destinations, when set, is asked right before a message is published
	// whether its sink may publish to its destination (the daemon's:
	// destination.Syntax.Check under the route of the message's ingest). A
	// message it refuses is dead with the reason and never reaches the
	// broker: whatever path parked it, and whichever version.
	Destinations func(m *envelope.Message) error
	// DeadLetter, when set, gets a copy of every message that goes dead.
	DeadLetter *sinks.DeadLetter
	// DrainTimeout bounds the work finished after Run's context ends
	// (required).
	DrainTimeout time.Duration
	// MaxRates are the sinks' configured max_rate (messages/s, shared by
	// every instance); a sink without one is not throttled. The one
	// recorded in Redis by the last instance to start wins
	// (store.SinkState.MaxRate, read at each refresh).
	MaxRates map[string]float64
	// Trace, when set, is given the timeline of every publish (see Trace).
	// It is called from the shard loops, concurrently.
	Trace func(Trace)

	Clock   Clock          // default SystemClock
	Rand    func() float64 // jitter source in [0,1); default math/rand
	Metrics *metrics.Metrics
	Tracer  *tracing.Tracer // nil: no spans
	Logger  *slog.Logger
}

// Scheduler runs the shard loops.
type Scheduler struct {
	p      Params
	log    *slog.Logger
	shards []shardState
	gate   *gate

	stalls   *stalls
	pace     *pace
	failures *failures
	// redisWarn logs a shard's claim or commit that Redis refused or did
	// not answer, once per shard and kind of work per RepeatInterval: a
	// shard meets an outage at each retry.
	redisWarn *logrepeat.Warner
	detached  sync.WaitGroup // publishes apart (detach, or past their grace), waited for by Run
	// apart maps the ID of each message published apart to a channel
	// closed once that publish is settled and written (Settled waits on it).
	apart sync.Map

	mu       sync.Mutex
	storeErr error                    // last claim failure, for readiness
	claims   map[string]chan struct{} // claimsPerNode's tokens by node
}

// awake is shardState.planned while a shard is claiming: any Notify wakes
// it again, since the claim may have missed the new message.
const awake = math.MaxInt64

type shardState struct {
	wake    chan struct{} // capacity 1: wake-ups coalesce
	planned atomic.Int64  // when the shard plans to claim next, Unix ms (Redis clock)
	// empty is set while the shard sleeps after a claim that left nothing
	// in it (lookEmpty wakes it when something comes).
	empty atomic.Bool
	// pub runs the shard's publishes (set by its loop, which alone calls
	// fire).
	pub *publisher
	// since is Redis's time at the loop's first claim (read and written
	// by the loop alone): a max_rate slot that passed before it passed
	// with no claimer here (staleSlot).
	since time.Time
	// settling is open while a publish of the shard is under way or the
	// acks of one wait to ride with the shard's next claim or commit, and
	// closed once they are written (Settled waits on it); nil while
	// neither. Guarded by settleMu.
	settleMu sync.Mutex
	settling chan struct{}
}

// publishing marks a publish of the shard begun: Settled waits until its
// acks are written.
func (st *shardState) publishing() {
	st.settleMu.Lock()
	if st.settling == nil {
		st.settling = make(chan struct{})
	}
	st.settleMu.Unlock()
}

// settled says nothing of the shard is published or waits to be acked
// any more: Settled's callers go on.
func (st *shardState) settled() {
	st.settleMu.Lock()
	if st.settling != nil {
		close(st.settling)
		st.settling = nil
	}
	st.settleMu.Unlock()
}

// Settled waits, until ctx ends, for the publishes this instance has under
// way on the shard of message id to end and their acks to be in Redis,
// waking the shard so that acks waiting to ride with its next claim or
// commit (ackRide, commitRide) go at once: a message this instance
// delivered is then gone from Redis, not shown in flight, and one it
// failed to publish is back in its state; and, when this instance
// publishes id apart (to a stalled destination, or past its grace), for
// that publish to be settled. Not waited for: a publish another instance
// has under way. Safe for concurrent use.
func (s *Scheduler) Settled(ctx context.Context, id string) {
	st := &s.shards[s.p.Store.ShardOf(id)]
	st.settleMu.Lock()
	ch := st.settling
	st.settleMu.Unlock()
	if ch != nil {
		st.poke()
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
	if apart, ok := s.apart.Load(id); ok {
		select {
		case <-apart.(chan struct{}):
		case <-ctx.Done():
		}
	}
}

// publisher is a shard's goroutine for its publishes, alive as long as the
// shard's loop: a publish grows a goroutine's stack (the sinks format
// headers, the network sets deadlines), and a new goroutine per publish
// grew it anew each time, an eighth of the daemon's CPU at 1k msg/s where
// each publish carries about one message. A publish that finds it busy
// (another sink's publish of the same batch, or one left running past its
// grace) runs on a goroutine of its own, as before.
type publisher struct {
	jobs chan func() // capacity 1: a job is handed over only when idle
	idle atomic.Bool
}

func newPublisher() *publisher {
	p := &publisher{jobs: make(chan func(), 1)}
	p.idle.Store(true)
	go func() {
		for f := range p.jobs {
			f()
			p.idle.Store(true)
		}
	}()
	return p
}

// run runs f on the publisher if it is idle, else on a new goroutine (also
// when p is nil).
func (p *publisher) run(f func()) {
	if p != nil && p.idle.CompareAndSwap(true, false) {
		p.jobs <- f
		return
	}
	go f()
}

// stop ends the publisher once its job, if any, is done; nothing may be
// run on it after.
func (p *publisher) stop() { close(p.jobs) }

// emptyClaimEvery is how many scheduler.max_sleep an empty shard sleeps
// before it claims again on its own: each max_sleep, lookEmpty asks Redis
// in one pipeline of plain reads whether the empty shards hold anything
// now, and wakes those that do, instead of each claiming (a script and a
// wake-up each); the shard's own claim is the fallback, should the looks
// fail.
const emptyClaimEvery = 10

// New returns a Scheduler; Run starts it.
func New(p Params) *Scheduler {
	if p.BatchSize <= 0 || p.Lease <= 0 || p.LeaseMargin <= 0 || p.LeaseMargin >= p.Lease || p.MaxSleep <= 0 || p.PublishTimeout <= 0 || p.MaxAttempts <= 0 || p.RepeatInterval <= 0 ||
		p.Backoff.Min <= 0 || p.Backoff.Max <= 0 || p.Backoff.Multiplier < 1 || p.DrainTimeout <= 0 {
		panic(fmt.Sprintf("scheduler.New: a required value is missing (config.ApplyDefaults gives them all): %+v", p))
	}
	if p.Clock == nil {
		p.Clock = SystemClock{}
	}
	if p.Rand == nil {
		p.Rand = defaultRand
	}
	if p.Logger == nil {
		p.Logger = slog.Default()
	}
	s := &Scheduler{p: p, log: p.Logger.With("component", "scheduler"), shards: make([]shardState, p.Store.Shards()),
		claims: map[string]chan struct{}{}}
	for i := range s.shards {
		s.shards[i].wake = make(chan struct{}, 1)
		s.shards[i].planned.Store(awake)
	}
	s.gate = newGate(p.Store, p.Sinks, p.BatchSize, s.log, p.Metrics, s.wakeAll)
	s.stalls = newStalls(p.PublishTimeout, p.Clock, p.Sinks)
	s.pace = newPace()
	s.failures = newFailures(p.RepeatInterval, s.log, p.Metrics)
	s.redisWarn = logrepeat.NewWarner(s.log, "redis refused or did not answer a shard's work; retrying", p.RepeatInterval, 2*p.Store.Shards())
	return s
}

// Notify tells the scheduler that a message was parked, so that its shard
// wakes now if it planned to sleep past the message's due time. It never
// blocks.
func (s *Scheduler) Notify(id string, due time.Time) {
	st := &s.shards[s.p.Store.ShardOf(id)]
	if due.UnixMilli() < st.planned.Load() {
		st.poke()
	}
}

// poke wakes the shard's loop, at once if it sleeps, else when it next
// would; it never blocks, and wake-ups coalesce.
func (st *shardState) poke() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// wakeAll wakes every shard (held messages were released).
func (s *Scheduler) wakeAll() {
	for i := range s.shards {
		s.shards[i].poke()
	}
}

// Ready returns the last claim error, nil when claims work.
func (s *Scheduler) Ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.storeErr
}

func (s *Scheduler) setStoreErr(err error) {
	s.mu.Lock()
	s.storeErr = err
	s.mu.Unlock()
}

// Run runs every shard until ctx ends, then finishes the publishes under way
// (within DrainTimeout) and returns.
func (s *Scheduler) Run(ctx context.Context) error {
	work, cancelWork := lifecycle.DrainContext(ctx, s.p.DrainTimeout)
	defer cancelWork()

	if err := s.gate.refresh(ctx, s.p.Clock.Now()); err != nil && ctx.Err() == nil {
		s.log.Warn("cannot read the sinks' state from redis; retrying", "err", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.refreshLoop(ctx)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.lookLoop(ctx)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.failures.run(ctx, s.p.Clock)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.redisWarn.Run(ctx, s.p.Clock.Now)
	}()
	for i := range s.shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.loop(ctx, work, i)
		}()
	}
	wg.Wait()
	s.detached.Wait() // the publishes apart finish within the drain budget (work)
	return nil
}

// refreshLoop refreshes the sink gate every MaxSleep until ctx ends. It
// runs on the wall clock, not the injected one: it reads the state of
// Redis and of the sinks, which a test's fake clock does not move.
func (s *Scheduler) refreshLoop(ctx context.Context) {
	lifecycle.Every(ctx, s.p.MaxSleep, func() {
		if err := s.gate.refresh(ctx, s.p.Clock.Now()); err != nil && ctx.Err() == nil {
			s.log.Warn("cannot read the sinks' state from redis; retrying", "err", err)
		}
	})
}

// lookLoop looks at the empty shards (lookEmpty) every MaxSleep until ctx
// ends, apart from the gate's refresh, which a long release or a Redis that
// does not answer can hold up. On the wall clock, as refreshLoop.
func (s *Scheduler) lookLoop(ctx context.Context) {
	lifecycle.Every(ctx, s.p.MaxSleep, func() {
		lctx, cancel := context.WithTimeout(ctx, s.p.MaxSleep)
		defer cancel()
		s.lookEmpty(lctx)
	})
}

// lookEmpty wakes the empty shards (shardState.empty) that Redis says hold
// something now: parked by another instance, or by this one without a
// Notify. On an error it wakes them all, to claim as usual; and each
// MaxSleep the look takes, too, as if they claimed on their own: the look
// is one pipeline over every empty shard, so one Redis Cluster node that
// does not answer would hold up the shards of the others, and go-redis
// ends a read at redis.read_timeout, not at the context's deadline.
func (s *Scheduler) lookEmpty(ctx context.Context) {
	var empty []int
	for i := range s.shards {
		if s.shards[i].empty.Load() {
			empty = append(empty, i)
		}
	}
	if len(empty) == 0 {
		return
	}
	looked := make(chan struct{})
	go func() {
		late := time.NewTicker(s.p.MaxSleep)
		defer late.Stop()
		for {
			select {
			case <-looked:
				return
			case <-late.C:
				for _, i := range empty {
					s.shards[i].poke()
				}
			}
		}
	}()
	occupied, err := s.p.Store.Occupied(ctx, empty)
	close(looked)
	for j, i := range empty {
		if err != nil || occupied[j] {
			s.shards[i].poke()
		}
	}
}

// loop claims and fires one shard until ctx ends.
//
// It plans its wake-ups on Redis's clock, the clock of the due times: the
// claim answers Redis's time to the microsecond, taken as halfway through the
// claim's round trip, which gives the offset from our clock; the shard then
// sleeps until the next due time less that offset, so that it wakes when the
// message is due on Redis's clock, not a fraction of a millisecond plus a
// round trip later.
//
// With Params.Ahead, a claim also takes what falls due within it, ahead of
// time (store.Claimed.Ahead): the shard holds those (ahead.go) and, the
// store's commit lead before each one's due instant, commits it
// (store.Commit, a round trip of IDs only), then publishes what the commit
// put in flight at the instant. Redis's work for a message (finding it,
// reading and decoding it, and the commit) is then done before its due
// instant, and a cancel, replace, reschedule or pause that came first
// still wins: one that meets a message committed ahead is answered after
// its instant.
func (s *Scheduler) loop(ctx, work context.Context, shard int) {
	st := &s.shards[shard]
	st.pub = newPublisher()
	defer st.pub.stop()
	failing := lifecycle.Backoff{Min: 50 * time.Millisecond, Max: 5 * time.Second}
	var tr Trace // this iteration's times, for Params.Trace
	tr.Shard = shard
	// The acks of the last batches of one lease, when they ride with the
	// next claim or commit.
	var acks []store.Done
	var acksLease *store.Lease
	var acksAt time.Time // when acksLease was claimed, on our clock
	flush := func(ctx context.Context) {
		s.record(ctx, acksLease, acksAt, "ack", len(acks), func(ctx context.Context) error {
			return s.settleOne(ctx, store.Settlement{Lease: acksLease, Done: acks})
		})
		acks = nil
	}
	// keep adds the acks of a fired batch of lease c (claimed at) to those
	// waiting, which must be of the same lease.
	keep := func(ds []store.Done, c *store.Lease, at time.Time) {
		if len(ds) > 0 {
			if len(acks) > 0 && acksLease.ExpiryMs != c.ExpiryMs {
				flush(work)
			}
			if len(acks) == 0 {
				acksLease, acksAt = c, at
			}
			acks = append(acks, ds...)
		}
		if len(acks) == 0 {
			st.settled()
		}
	}
	// ride hands the acks waiting to the shard's next claim or commit, with
	// what to do once it is answered: on error they go out on their own.
	ride := func() (*store.Lease, []store.Done, func(error)) {
		if len(acks) == 0 || acksLease.Shard != shard {
			return nil, nil, nil
		}
		return acksLease, acks, func(err error) {
			if err != nil {
				flush(work) // on its own, retried until done or the lease ends
			}
			acks = nil
			st.settled()
		}
	}
	var held aheadQueue // claimed ahead, waiting for their due instant
	var offset time.Duration
	var floor redisFloor // never early: when an instant has come on Redis's clock
	defer func() {
		s.giveBack(work, &held) // what this instance held ahead is anybody's again at once
		if len(acks) > 0 {
			flush(work) // stopping: the last acks go out within the drain budget
		}
		st.settled()
	}()
	claimAt := s.p.Clock.Now() // when to claim next, on our clock
	for ctx.Err() == nil {
		if at, ok := held.next(); ok && !at.Add(-offset-s.p.Store.CommitLead()).After(s.p.Clock.Now()) {
			retryAt, notified, err := s.commitDue(work, st, &held, &offset, &floor, &tr, ride, keep)
			if !retryAt.IsZero() {
				claimAt = earliest(claimAt, retryAt)
			}
			if notified {
				claimAt = s.p.Clock.Now() // a new message may be due before the plan
			}
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.setStoreErr(err)
				wait := failing.Next()
				s.redisWarn.Warn("commit:"+strconv.Itoa(shard), s.p.Clock.Now(), "op", "commit of messages claimed ahead", "shard", shard, "err", err, "retry_in", wait)
				s.sleep(ctx, st, wait)
				continue
			}
		}
		if !claimAt.After(s.p.Clock.Now()) {
			st.planned.Store(awake)
			st.empty.Store(false)
			done, ok := s.claimTurn(ctx, shard)
			if !ok {
				return
			}
			ask := store.Ask{Max: s.p.BatchSize, Lease: s.p.Lease, Ahead: s.p.Ahead}
			if held.len() >= aheadHeld*s.p.BatchSize {
				ask.Ahead = 0 // holding enough: only what is due, until some is committed
			}
			sent := s.p.Clock.Now()
			ask.Blocked = s.gate.blocked(sent)
			prev, riding, rode := ride()
			c, err := s.p.Store.ClaimAhead(ctx, shard, prev, riding, ask)
			done()
			if rode != nil {
				rode(err)
			}
			claimedAt := s.p.Clock.Now()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.setStoreErr(err)
				wait := failing.Next()
				s.redisWarn.Warn("claim:"+strconv.Itoa(shard), s.p.Clock.Now(), "op", "claim", "shard", shard, "err", err, "retry_in", wait)
				s.sleep(ctx, st, wait)
				claimAt = s.p.Clock.Now()
				continue
			}
			if failing.Failing() {
				s.setStoreErr(nil)
				failing.Reset()
			}
			if st.since.IsZero() {
				st.since = c.Now
			}
			fence := s.fence(c, sent)
			offset = store.Offset(sent, c.Now, claimedAt)
			floor.observe(c.Now, sent, claimedAt)
			tr.ClaimSent, tr.ClaimAnswered, tr.RedisNow, tr.Offset, tr.Committed = sent, claimedAt, c.Now, offset, false
			claimAt = claimedAt.Add(s.p.MaxSleep)
			if !c.Next.IsZero() {
				claimAt = earliest(claimAt, c.Next.Add(-offset))
			} else if len(c.Messages) == 0 && held.len() == 0 {
				// Nothing left in the shard: lookEmpty watches it.
				claimAt = claimedAt.Add(emptyClaimEvery * s.p.MaxSleep)
				st.empty.Store(true)
			}
			due := held.add(c, fence)
			if n := len(c.Messages); n > 0 {
				s.p.Metrics.ClaimBatchSize.Observe(float64(n))
				if len(due.Messages) > 0 {
					st.publishing()
					ds, retryAt := s.fire(work, due, claimedAt, fence, offset, &tr)
					keep(ds, due, claimedAt)
					if !retryAt.IsZero() {
						claimAt = earliest(claimAt, retryAt)
					}
				}
				if n == s.p.BatchSize {
					s.p.Metrics.SchedulerWakeups.WithLabelValues("batch").Inc()
					tr.Planned, tr.Woke = time.Time{}, time.Time{}
					claimAt = s.p.Clock.Now()
					continue // more may be due: the acks ride with that claim
				}
			}
		}
		wakeAt := claimAt
		now := s.p.Clock.Now()
		// the acks wait for a claim within ackRide or a commit within
		// commitRide, else they go out now
		soon := !claimAt.After(now.Add(ackRide))
		if at, ok := held.next(); ok {
			commitAt := at.Add(-offset - s.p.Store.CommitLead())
			wakeAt = earliest(wakeAt, commitAt)
			soon = soon || !commitAt.After(now.Add(commitRide))
		}
		if len(acks) > 0 && !soon {
			flush(work)
			st.settled()
		}
		st.planned.Store(claimAt.Add(offset + s.p.Ahead).UnixMilli())
		wait := wakeAt.Sub(s.p.Clock.Now())
		if wait <= 0 {
			tr.Planned, tr.Woke = time.Time{}, time.Time{}
			continue
		}
		tr.Planned = wakeAt.Add(offset)
		if s.sleep(ctx, st, wait) {
			claimAt = s.p.Clock.Now() // a new message may be due before the plan
		}
		tr.Woke = s.p.Clock.Now()
	}
}

// fence is the instant, on our clock, from which the messages of lease c
// (claimed when our clock read sent) are not published any more: the
// lease's length (its expiry less Redis's time at the claim, which came
// after sent) less LeaseMargin, counted from sent. Our clock is monotonic:
// a process paused (SIGSTOP, a long GC or VM stall) past it finds its
// lease nearly over, or over and taken by another instance, and claims its
// messages again rather than publishing what may have been cancelled,
// rescheduled or published by the other meanwhile.
func (s *Scheduler) fence(c *store.Lease, sent time.Time) time.Time {
	return sent.Add(c.Expiry().Sub(c.Now) - s.p.LeaseMargin)
}

// errFenced is a publish not started because the lease was nearly over.
var errFenced = errors.New("not published: less than scheduler.lease_margin of the lease was left (this process was paused or starved); claimed again first")

// claimsPerNode is how many shards of an instance claim from one Redis
// node at once. A claim of a full batch with its acks riding runs in Redis
// for a few milliseconds, and Redis runs what waits in turn: with sixteen
// shards claiming at once in a drain, a commit due at its instant or a
// GET /v1/stats waited behind up to sixteen of them. Two keep Redis busy
// while the other shards publish (docs/performance.md, "A million due
// within one second", has the figures). Commits, acks on their own and
// the other calls do not wait for a turn.
const claimsPerNode = 2

// claimTurn waits until the shard may claim (claimsPerNode); done gives
// the turn back. ok is false when ctx ended first.
func (s *Scheduler) claimTurn(ctx context.Context, shard int) (done func(), ok bool) {
	node := s.p.Store.Node(ctx, shard)
	s.mu.Lock()
	turns := s.claims[node]
	if turns == nil {
		turns = make(chan struct{}, claimsPerNode)
		s.claims[node] = turns
	}
	s.mu.Unlock()
	select {
	case turns <- struct{}{}:
		return func() { <-turns }, true
	case <-ctx.Done():
		return nil, false
	}
}

// ackRide is how soon the next claim must be for a batch's acks to ride
// with it instead of going out on their own: a round trip saved per batch
// when messages come due back to back, and never an ack held longer for a
// claim (commitRide says how long for a commit).
const ackRide = 2 * time.Millisecond

// commitRide is how soon the shard's next commit (of a message claimed
// ahead, just before its instant) must be for the acks to wait for it
// instead. At a moderate rate each commit and each ack carries about one
// message, and a call's fixed part is most of what a message costs Redis:
// riding with the commit makes two calls per message one. Until then Redis
// shows the published message in flight; the admin API asks Settled, which
// sends the acks at once, before it answers so.
const commitRide = 50 * time.Millisecond

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Trace is the timeline of one publish of a claimed batch to one sink,
// given to Params.Trace to find where the time between a due time and its
// confirmation goes. Times are on the scheduler's clock but Planned and
// RedisNow, which are on Redis's; Offset is Redis's clock minus ours as the
// shard estimated it from the claim.
type Trace struct {
	Shard         int
	Planned       time.Time // the Redis time the shard slept until; zero when it claimed at once
	Woke          time.Time // when that sleep ended; zero with Planned
	ClaimSent     time.Time
	ClaimAnswered time.Time
	RedisNow      time.Time // Redis's time in the claim
	Offset        time.Duration
	// Committed: the batch was claimed ahead, and ClaimSent and
	// ClaimAnswered are its commit's round trip, the store's commit lead
	// before the due instant.
	Committed   bool
	PublishSent time.Time
	Confirmed   time.Time
	Sink        string
	Due         []time.Time // due times of the batch's messages (Redis's clock)
}

// sleepUntil waits until our clock reads t, or ctx ends: a Notify does not
// end it, and it reports whether one came.
func (s *Scheduler) sleepUntil(ctx context.Context, st *shardState, t time.Time) (notified bool) {
	for ctx.Err() == nil {
		d := t.Sub(s.p.Clock.Now())
		if d <= 0 {
			break
		}
		if s.sleep(ctx, st, d) {
			notified = true
		}
	}
	return notified
}

// sleep waits for d, a Notify, or the end of ctx; it reports whether a
// Notify woke it.
func (s *Scheduler) sleep(ctx context.Context, st *shardState, d time.Duration) bool {
	t := s.p.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C():
		s.p.Metrics.SchedulerWakeups.WithLabelValues("timer").Inc()
	case <-st.wake:
		s.p.Metrics.SchedulerWakeups.WithLabelValues("notify").Inc()
		return true
	}
	return false
}

// fire publishes a lease's messages and records the outcome of each in
// Redis but the acks. It returns the earliest time, on our clock, a message
// was parked again for (a retry, a publish slot, a recurring message's next
// occurrence; zero when none was): the claim's Next could not know it.
//
// The acks it returns (the messages the sinks confirmed) are not written:
// the caller writes them, alone or with its next claim. The messages to a
// destination that stalled (stalls) are published apart (detach), and
// settle and ack on their own.
func (s *Scheduler) fire(ctx context.Context, c *store.Lease, claimedAt, fence time.Time, toRedis time.Duration, tr *Trace) (acks []store.Done, retryAt time.Time) {
	errs := make([]error, len(c.Messages))
	skipped := make([]bool, len(c.Messages))
	groups := map[string][]int{}
	var apart []int
	for i, m := range c.Messages {
		switch {
		case m.Err != nil:
			errs[i] = sinks.Permanent(fmt.Errorf("cannot decode the stored message: %w", m.Err))
		case s.p.LateDead && s.p.MaxLateness > 0 && c.Now.Sub(m.Message.DueAt) > s.p.MaxLateness:
			errs[i] = &lateError{due: m.Message.DueAt, claimed: c.Now, max: s.p.MaxLateness}
		case s.p.Sinks[m.Message.Sink] == nil:
			errs[i] = sinks.Rejected(fmt.Errorf("sink %q is not configured", m.Message.Sink))
		case s.refused(m.Message) != nil:
			errs[i] = sinks.Permanent(s.refused(m.Message))
		case m.Message.Recur != nil && !m.Sent && m.Message.Recur.Skip(m.Message.DueAt, c.Now):
			// A missed occurrence under route.missed skip: parks the next
			// one, publishes nothing. Not one sent before without a
			// confirmation: its broker may have it, and it is published
			// again (the sink deduplicates it) until it is confirmed, the
			// series going on from it then.
			skipped[i] = true
			s.p.Metrics.Skipped.Inc()
		case s.stalls.suspect(m.Message.Sink, m.Message.Destination):
			apart = append(apart, i)
		default:
			groups[m.Message.Sink] = append(groups[m.Message.Sink], i)
		}
	}
	var slots []store.Slot
	for name, idx := range groups {
		if rate := s.gate.maxRate(name, s.p.MaxRates[name]); rate > 0 {
			var deferred []store.Slot
			groups[name], deferred = s.throttle(ctx, name, rate, c, idx)
			slots = append(slots, deferred...)
		}
	}
	if len(apart) > 0 {
		s.detach(ctx, c, claimedAt, fence, toRedis, tr, apart)
	}
	// Each sink's publish runs on its own; one that outlasts a few times
	// the sink's usual publish is left to settle on its own (detached), so
	// that the shard goes on claiming: a destination that does not answer
	// holds nothing behind it.
	var running []*publishing
	trace := *tr // a detached publish reads it after the loop moved on
	for name, idx := range groups {
		if len(idx) == 0 {
			continue
		}
		p := &publishing{idx: idx, done: make(chan struct{})}
		running = append(running, p)
		s.shards[c.Shard].pub.run(func() {
			s.publish(ctx, name, c, idx, errs, fence, toRedis, &trace)
			if !p.state.CompareAndSwap(publishRunning, publishDone) {
				// Detached meanwhile: settle and ack here.
				s.settleApart(ctx, c, claimedAt, toRedis, idx, errs, skipped)
			}
			close(p.done)
		})
	}
	var detached []int
	for _, p := range running {
		grace := s.pace.grace(c.Messages[p.idx[0]].Message.Sink)
		t := time.NewTimer(grace)
		select {
		case <-p.done:
		case <-t.C:
			if p.state.CompareAndSwap(publishRunning, publishDetached) {
				detached = append(detached, p.idx...)
				s.detached.Add(1)
				forget := s.publishedApart(c, p.idx, p.done)
				go func() { <-p.done; forget(); s.detached.Done() }()
			} else {
				<-p.done
			}
		}
		t.Stop()
	}

	deferred := make(map[string]bool, len(slots))
	for _, sl := range slots {
		deferred[sl.ID] = true
	}
	var settled []int
	for i := range c.Messages {
		if !deferred[c.Messages[i].ID] && !slices.Contains(apart, i) && !slices.Contains(detached, i) {
			settled = append(settled, i)
		}
	}
	acks, retryAt = s.settle(ctx, c, claimedAt, toRedis, settled, errs, skipped, slots)
	for _, sl := range slots {
		if at := sl.At.Add(-toRedis); retryAt.IsZero() || at.Before(retryAt) {
			retryAt = at
		}
	}
	return acks, retryAt
}

// detach publishes the messages idx of a lease, to destinations that
// stalled, apart from the others: in the background, so that the shard
// goes on; they settle and are acked on their own, under their lease. Run
// waits for them when it stops.
func (s *Scheduler) detach(ctx context.Context, c *store.Lease, claimedAt, fence time.Time, toRedis time.Duration, tr *Trace, idx []int) {
	bySink := map[string][]int{}
	for _, i := range idx {
		name := c.Messages[i].Message.Sink
		bySink[name] = append(bySink[name], i)
	}
	trace := *tr
	ctx = sinks.WithApart(ctx)
	s.detached.Add(1)
	done := make(chan struct{})
	forget := s.publishedApart(c, idx, done)
	go func() {
		defer s.detached.Done()
		defer forget()
		defer close(done)
		errs := make([]error, len(c.Messages))
		var wg sync.WaitGroup
		for name, idx := range bySink {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.publish(ctx, name, c, idx, errs, fence, toRedis, &trace)
			}()
		}
		wg.Wait()
		s.settleApart(ctx, c, claimedAt, toRedis, idx, errs, make([]bool, len(c.Messages)))
	}()
}

// publishedApart records that the messages idx of a lease are published
// apart, settled and written when done is closed, for Settled; the func it
// returns forgets them (once done is closed).
func (s *Scheduler) publishedApart(c *store.Lease, idx []int, done chan struct{}) func() {
	for _, i := range idx {
		s.apart.Store(c.Messages[i].ID, done)
	}
	return func() {
		for _, i := range idx {
			s.apart.CompareAndDelete(c.Messages[i].ID, done)
		}
	}
}

// settleApart settles the messages idx of a lease published apart from
// the shard's loop, and writes their acks.
func (s *Scheduler) settleApart(ctx context.Context, c *store.Lease, claimedAt time.Time, toRedis time.Duration, idx []int, errs []error, skipped []bool) {
	acks, at := s.settle(ctx, c, claimedAt, toRedis, idx, errs, skipped, nil)
	s.record(ctx, c, claimedAt, "ack", len(acks), func(ctx context.Context) error {
		return s.settleOne(ctx, store.Settlement{Lease: c, Done: acks})
	})
	if !at.IsZero() {
		s.wakeShard(c.Shard)
	}
}

// publishing is one sink's publish of a lease's messages idx.
type publishing struct {
	idx   []int
	state atomic.Int32 // publishRunning, then publishDone or publishDetached
	done  chan struct{}
}

const (
	publishRunning int32 = iota
	publishDone
	publishDetached
)

// settle records the outcome of the messages idx of a lease from their
// publish errors: retries, deaths, holds and postponements are written
// with the deferred slots in one Settle call; the acks are returned (they
// ride with the shard's next claim), with the earliest time (our clock) a
// message was parked again for.
func (s *Scheduler) settle(ctx context.Context, c *store.Lease, claimedAt time.Time, toRedis time.Duration, idx []int, errs []error, skipped []bool, slots []store.Slot) (acks []store.Done, retryAt time.Time) {
	now := s.p.Clock.Now()
	var (
		retries   []store.RetryAt
		postpones []store.RetryAt
		deads     []store.Failure
		holds     []store.Unavailable
		unsure    []string
		letters   []sinks.Dead
		late      int
		fenced    int
	)
	earliest := func(at time.Time) {
		if retryAt.IsZero() || at.Before(retryAt) {
			retryAt = at
		}
	}
	for _, i := range idx {
		m := c.Messages[i]
		err := errs[i]
		sink, dest := "", ""
		if m.Message != nil {
			sink, dest = m.Message.Sink, m.Message.Destination
		} else if m.Clear != nil { // undecodable: where it was going is kept in clear
			sink, dest = m.Clear.Sink, m.Clear.Destination
		}
		if maybeSent(err) {
			unsure = append(unsure, m.ID) // marked if it is retried or put back; a dead one is not cancelled
		}
		switch {
		case err == nil:
			d := s.done(m.Message, c.Now, skipped[i])
			acks = append(acks, d)
			if d.Next != nil { // the next occurrence: the claim's Next could not know it either
				earliest(d.Next.DueAt.Add(-toRedis))
			}
			if !skipped[i] {
				s.gate.delivered(sink)
			}
		case errors.Is(err, errFenced):
			// Not published: due again at once, for whoever claims it
			// first (this instance too), its attempt not counted.
			postpones = append(postpones, store.RetryAt{ID: m.ID, At: m.Message.DueAt, Reason: err.Error()})
			earliest(now)
			fenced++
		case postponed(err) || sinks.IsAgain(err) || sinks.IsNotSent(err):
			// A destination that stalled while its sink answered, a
			// publish the sink could not tell was this message's fault (it
			// answered the others), or one the sink did not send (its
			// bound of publishes awaiting an answer full, or its batch's
			// time over before its turn): not the sink's (no hold) and,
			// for a stall the first times, not counted. Published again
			// soon.
			at := now.Add(s.p.Backoff.Delay(1, s.p.Rand()))
			postpones = append(postpones, store.RetryAt{ID: m.ID, At: at.Add(toRedis), Reason: err.Error()})
			earliest(at)
			s.p.Metrics.Retries.WithLabelValues(sink).Inc()
			if postponed(err) {
				s.failures.warn(now, "destination did not answer; publishing it again later, apart from the others", sink, dest, "id", m.ID, "err", err)
			}
		case sinks.IsDown(err):
			// Its destination refused it, storing nothing, for a state
			// that passes (a stream without its leader) while the sink
			// answers: neither counted nor held; published again after
			// about as long again as it has waited (downBackoff: 0.5 s
			// to 30 s), so that a destination down for a time T costs
			// each of its messages about log2(T) publishes.
			at := now.Add(downBackoff.Delay(downBackoff.AttemptAfter(now.Sub(m.Message.DueAt)), s.p.Rand()))
			postpones = append(postpones, store.RetryAt{ID: m.ID, At: at.Add(toRedis), Reason: err.Error()})
			earliest(at)
			s.p.Metrics.Retries.WithLabelValues(sink).Inc()
			s.failures.warn(now, "destination down; publishing it again later without counting an attempt", sink, dest, "id", m.ID, "err", err)
		case sinks.IsUnavailable(err) && !errors.As(err, new(*lateError)):
			holds = append(holds, store.Unavailable{ID: m.ID, Band: s.gate.band(sink), DueAt: m.Message.DueAt})
			s.gate.unavailable(sink, now, err)
			s.p.Metrics.Held.WithLabelValues(sink).Inc()
		case sinks.IsPermanent(err) || errors.As(err, new(*lateError)) || m.Attempt >= s.p.MaxAttempts:
			reason := err.Error()
			if !sinks.IsPermanent(err) && !errors.As(err, new(*lateError)) {
				reason = fmt.Sprintf("publish failed %d times, last: %s", m.Attempt, err)
			}
			deads = append(deads, store.Failure{ID: m.ID, Reason: reason})
			letters = append(letters, sinks.Dead{Message: m.Message, Reason: reason, Attempts: m.Attempt})
			if errors.As(err, new(*lateError)) {
				late++
			}
			s.failures.warn(now, "message is dead", sink, dest, "id", m.ID, "attempts", m.Attempt, "reason", reason)
		default:
			at := now.Add(s.p.Backoff.Delay(m.Attempt, s.p.Rand()))
			retries = append(retries, store.RetryAt{ID: m.ID, At: at.Add(toRedis), Reason: err.Error()})
			earliest(at)
			s.p.Metrics.Retries.WithLabelValues(sink).Inc()
			s.log.Debug("publish failed; will retry", "id", m.ID, "sink", sink, "attempt", m.Attempt, "at", at, "err", err)
		}
	}
	if fenced > 0 {
		s.p.Metrics.Fenced.Add(float64(fenced))
		s.log.Warn("claimed messages not published: their lease was nearly over (this process was paused or starved); they are claimed again",
			"shard", c.Shard, "messages", fenced, "lease_margin", s.p.LeaseMargin)
	}
	if len(deads) > 0 {
		s.p.Metrics.DeadTotal.WithLabelValues("sink").Add(float64(len(deads) - late))
		s.p.Metrics.DeadTotal.WithLabelValues("late").Add(float64(late))
	}
	st := store.Settlement{Lease: c, Retry: retries, Dead: deads, Hold: holds, Defer: slots, Postpone: postpones, Unconfirmed: unsure}
	s.record(ctx, c, claimedAt, "settle", st.Len(), func(ctx context.Context) error {
		return s.settleOne(ctx, st)
	})
	s.p.DeadLetter.Publish(ctx, letters)
	return acks, retryAt
}

// fencedSentError is a publish claimed again first, as errFenced (it Is
// errFenced), whose message was sent and not confirmed: the broker may
// hold a copy (it Is a sinks.Sent). It wraps neither the publish's error
// nor its timeout, which would make the lease's end a destination's
// stall; it keeps its text.
type fencedSentError struct{ err string }

func (e *fencedSentError) Error() string {
	return "claimed again first, the lease nearly over (this process was paused or starved); a publish of it was sent and not confirmed, and may have arrived: " + e.err
}

func (e *fencedSentError) Is(target error) bool { return target == errFenced }

func (e *fencedSentError) As(target any) bool {
	if t, ok := target.(**sinks.SentError); ok {
		*t = &sinks.SentError{Err: errors.New(e.err)}
		return true
	}
	return false
}

// maybeSent reports whether a failed publish may have reached its broker
// all the same: it was sent and its confirmation did not come in time or
// was lost with the connection (sinks.Sent), or the sink could not tell
// (sinks.Again), or its destination stalled. Such
// a message is published again, and until it is gone a cancel or a change
// meets it as in flight (store.Settlement.Unconfirmed): its broker may
// still take the copy sent. A message not sent (the lease's fence, the
// time to begin sending over, sinks.NotSent) is not, nor one its
// destination refused storing nothing (sinks.Down).
func maybeSent(err error) bool {
	switch {
	case err == nil:
		return false
	case sinks.IsSent(err): // an earlier copy, whatever became of this try
		return true
	case errors.Is(err, sinks.ErrSendBy), sinks.IsNotSent(err), sinks.IsDown(err):
		return false
	}
	return sinks.ReasonOf(err) == sinks.ReasonTimeout || sinks.IsAgain(err) || postponed(err)
}

// settleOne writes one settlement (Store.Settle).
func (s *Scheduler) settleOne(ctx context.Context, st store.Settlement) error {
	_, errs := s.p.Store.Settle(ctx, []store.Settlement{st})
	return errs[0]
}

// wakeShard wakes one shard (a detached publish parked something again).
func (s *Scheduler) wakeShard(shard int) { s.shards[shard].poke() }

// refused is why the message may not be published to its destination
// (Params.Destinations), nil when it may.
func (s *Scheduler) refused(m *envelope.Message) error {
	if s.p.Destinations == nil {
		return nil
	}
	return s.p.Destinations(m)
}

// done is the ack of a delivered (or, under route.missed skip, passed over)
// message: for a recurring one, its next occurrence is parked in the same
// step, computed from the schedule (never from now), unless the series
// ended.
func (s *Scheduler) done(m *envelope.Message, now time.Time, skipped bool) store.Done {
	d := store.Done{ID: m.ID, Group: m.Group, Source: m.Ingest}
	if !skipped {
		d.Origin = m.Origin
	}
	if r := m.Recur; r != nil {
		if due, nr, ok := r.Following(m.DueAt, now); ok {
			next := *m
			next.DueAt, next.Recur = due, nr
			d.Next = &next
		}
	}
	return d
}

// staleSlot reports whether a message's max_rate slot passed unused while
// no instance claimed: more than slotGrace before this shard's loop began
// to claim (since). Such a message takes a new slot, as one that never had
// one, so that the slots that passed during a stop of every instance are
// not all used at once, flooding the sink max_rate protects. A slot that
// passed while the loop ran (a claim late behind a backlog) is used: a new
// one there would put the message behind newer ones, again at each late
// claim, and a claimer that stays late would publish nothing.
func staleSlot(slot, since time.Time) bool {
	return !since.IsZero() && slot.Before(since.Add(-slotGrace))
}

// slotGrace is how long before an instance's first claim a slot may have
// passed and still be used: what a restart may add to the rate in its
// first second, a tenth of it (a second's grace doubled it: the slots of
// the second before the start went out with those of the second after).
const slotGrace = 100 * time.Millisecond

// throttle splits the messages idx of a lease for a sink with max_rate into
// those whose publish slot has come (returned to publish now) and those
// that wait for theirs (deferred). A message that waited for its slot
// already is published without a new one, unless the slot is stale
// (staleSlot). When Redis cannot allot slots, everything waits a second.
func (s *Scheduler) throttle(ctx context.Context, sink string, rate float64, c *store.Lease, idx []int) (now []int, deferred []store.Slot) {
	var need []int
	for _, i := range idx {
		if slot := c.Messages[i].Slot; !slot.IsZero() && !staleSlot(slot, s.shards[c.Shard].since) {
			now = append(now, i)
		} else {
			need = append(need, i)
		}
	}
	if len(need) == 0 {
		return now, nil
	}
	redisNow, slots, err := s.p.Store.Slots(ctx, sink, len(need), rate)
	if err != nil {
		s.log.Warn("cannot allot publish slots for max_rate; the messages wait", "sink", sink, "err", err)
		for _, i := range need {
			deferred = append(deferred, store.Slot{ID: c.Messages[i].ID, At: c.Now.Add(time.Second)})
		}
		return now, deferred
	}
	for j, i := range need {
		if !slots[j].After(redisNow) {
			now = append(now, i)
			continue
		}
		deferred = append(deferred, store.Slot{ID: c.Messages[i].ID, At: slots[j]})
	}
	if len(deferred) > 0 {
		s.p.Metrics.Deferred.WithLabelValues(sink).Add(float64(len(deferred)))
	}
	return now, deferred
}

// lateError is why a message claimed too long after its due time is dead
// under late_policy dead. It is permanent: publishing later is later still.
type lateError struct {
	due, claimed time.Time
	max          time.Duration
}

func (e *lateError) Error() string {
	return fmt.Sprintf("late: due %s, claimed %s, more than scheduler.max_lateness %s after (late_policy dead)",
		e.due.UTC().Format(time.RFC3339Nano), e.claimed.UTC().Format(time.RFC3339Nano), e.max)
}

// publish sends the messages idx of a claim to one sink and records the
// results in errs. toRedis turns our clock into Redis's, the clock of the
// due times, for the lateness. From fence on it publishes nothing
// (errFenced): the lease may be over, and the messages another's.
func (s *Scheduler) publish(ctx context.Context, name string, c *store.Lease, idx []int, errs []error, fence time.Time, toRedis time.Duration, tr *Trace) {
	// The wall clock's reading (monotonic) as the fence is checked: the
	// publish's deadline counts from it, so that a pause right after the
	// check does not begin the publish's time anew when the process
	// resumes.
	checked := time.Now()
	if !s.p.Clock.Now().Before(fence) {
		for _, i := range idx {
			errs[i] = errFenced
		}
		return
	}
	out := make([]sinks.Outgoing, len(idx))
	var spans []tracing.Span
	if s.p.Tracer != nil {
		spans = make([]tracing.Span, len(idx))
	}
	for j, i := range idx {
		out[j] = sinks.Outgoing{Message: c.Messages[i].Message, Attempt: c.Messages[i].Attempt}
		if spans != nil {
			spans[j] = s.p.Tracer.StartFire(ctx, out[j].Message, out[j].Attempt)
		}
	}
	// The publish ends with the lease at the latest: a sink sends nothing
	// more once its context has ended (a process paused in the middle of a
	// batch sends none of the rest when it resumes past the lease).
	start := s.p.Clock.Now()
	leaseEnd := fence.Add(s.p.LeaseMargin)
	timeout := min(s.p.PublishTimeout, leaseEnd.Sub(start))
	pctx, cancel := context.WithDeadline(ctx, checked.Add(timeout))
	// No message of the batch begins after the fence, by the wall clock
	// (a batch sent one message at a time, behind slow confirms).
	pctx = sinks.WithSendBy(pctx, checked.Add(fence.Sub(start)))
	res := s.p.Sinks[name].Publish(pctx, out)
	cancel()
	done := s.p.Clock.Now()
	// Past the lease's end, whatever bounded the publish (the lease, or a
	// sink that took longer than its context), another instance may hold
	// the messages.
	outlived := !done.Before(leaseEnd)
	for j, err := range res {
		switch {
		case err == nil:
		case maybeSent(err) && (outlived || errors.Is(err, sinks.ErrSendBy)):
			// Sent, not confirmed within the lease (or sent before, and
			// not again past the fence): claimed again, not counted, and
			// marked, since the broker may hold a copy.
			res[j] = &fencedSentError{err: err.Error()}
		case outlived, errors.Is(err, sinks.ErrSendBy):
			res[j] = errFenced // not sent: claimed again, not counted
		}
	}
	s.p.Metrics.PublishDuration.WithLabelValues(name).Observe(done.Sub(start).Seconds())
	if s.p.Trace != nil {
		t := *tr
		t.PublishSent, t.Confirmed, t.Sink = start, done, name
		t.Due = make([]time.Time, len(out))
		for j := range out {
			t.Due[j] = out[j].DueAt
		}
		s.p.Trace(t)
	}
	for len(res) < len(out) {
		res = append(res, errors.New("sink returned no result"))
	}
	dests := make([]string, len(out))
	for j := range out {
		dests[j] = out[j].Destination
	}
	s.stalls.observe(name, start, dests, res)
	s.pace.observe(name, done.Sub(start), res)
	s.failures.published(name, dests, res, done)
	var ok int
	lateness := s.p.Metrics.FireLateness.WithLabelValues(name) // looked up once per batch
	for j, i := range idx {
		err := res[j]
		errs[i] = err
		if spans != nil {
			spans[j].End(err)
		}
		if err == nil {
			ok++
			lateness.Observe(done.Add(toRedis).Sub(out[j].DueAt).Seconds())
		}
	}
	s.p.Metrics.Published.WithLabelValues(name).Add(float64(ok))
}

// record writes the outcome of a lease's publishes to Redis (op: an ack, a
// retry or a death), trying again until it succeeds, the lease expires
// (another instance may then hold the messages, and the update would be
// refused anyway), or ctx ends. A lost ack means the message is published
// again: a duplicate, never a loss.
func (s *Scheduler) record(ctx context.Context, c *store.Lease, claimedAt time.Time, what string, n int, op func(context.Context) error) {
	if n == 0 {
		return
	}
	deadline := claimedAt.Add(c.Expiry().Sub(c.Now)) // the lease's end, in our clock
	bo := lifecycle.Backoff{Min: 50 * time.Millisecond, Max: 2 * time.Second}
	for attempt := 1; ; attempt++ {
		err := op(ctx)
		if err == nil {
			return
		}
		wait := bo.Next()
		if ctx.Err() != nil || s.p.Clock.Now().Add(wait).After(deadline) {
			s.log.Warn("cannot record publish results in redis; when the lease expires these messages are claimed again (a duplicate for those the sink took, none lost)",
				"op", what, "shard", c.Shard, "messages", n, "err", err)
			return
		}
		if attempt == 1 {
			s.log.Warn("cannot record publish results in redis; retrying", "op", what, "shard", c.Shard, "err", err)
		}
		t := s.p.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C():
		}
		t.Stop()
	}
}
