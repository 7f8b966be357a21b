package scheduler

import (
	"context"
	"slices"
	"time"

	"github.com/delaybridge/delaybridge/pkg/store"
)

// aheadHeld bounds what a shard holds claimed ahead, in batches
// (Params.BatchSize): past it, claims take only what is due until some of
// it is committed.
const aheadHeld = 4

// heldMsg is a message a shard claimed ahead, with the claim it is of.
type heldMsg struct {
	lease *store.Lease
	m     store.Claimed
}

// aheadQueue is what a shard holds claimed ahead, in the order it falls
// due (Claimed.At), then highest priority first, with the fence of each
// claim (Scheduler.fence). It is the shard loop's alone.
type aheadQueue struct {
	q      []heldMsg
	fences map[*store.Lease]time.Time
}

func (h *aheadQueue) len() int { return len(h.q) }

// next is when the first held message falls due, on Redis's clock.
func (h *aheadQueue) next() (time.Time, bool) {
	if len(h.q) == 0 {
		return time.Time{}, false
	}
	return h.q[0].m.At, true
}

// add takes the messages of claim c (fenced at fence) that were claimed
// ahead into the queue and returns a lease of the others, those claimed
// due (in flight now).
func (h *aheadQueue) add(c *store.Lease, fence time.Time) *store.Lease {
	due := *c
	due.Messages = nil
	var ahead []store.Claimed
	for _, m := range c.Messages {
		if m.Ahead {
			ahead = append(ahead, m)
		} else {
			due.Messages = append(due.Messages, m)
		}
	}
	if len(ahead) > 0 {
		if h.fences == nil {
			h.fences = map[*store.Lease]time.Time{}
		}
		h.fences[c] = fence
	}
	h.insert(c, ahead)
	return &due
}

// fence is the fence of claim c; pruneFences forgets those of the claims
// that have nothing left in the queue.
func (h *aheadQueue) fence(c *store.Lease) time.Time { return h.fences[c] }

func (h *aheadQueue) pruneFences() {
	for c := range h.fences {
		if !slices.ContainsFunc(h.q, func(hm heldMsg) bool { return hm.lease == c }) {
			delete(h.fences, c)
		}
	}
}

// insert queues messages ms of claim c.
func (h *aheadQueue) insert(c *store.Lease, ms []store.Claimed) {
	if len(ms) == 0 {
		return
	}
	for _, m := range ms {
		h.q = append(h.q, heldMsg{lease: c, m: m})
	}
	byInstant(h.q)
}

func priorityOf(m store.Claimed) int {
	if m.Message == nil {
		return 0
	}
	return int(m.Message.Priority)
}

// take removes from the queue the messages due by redisNow (all of them
// when redisNow is zero) and returns them grouped by claim: a commit is of
// one lease.
func (h *aheadQueue) take(redisNow time.Time) map[*store.Lease][]store.Claimed {
	n := 0
	for n < len(h.q) && (redisNow.IsZero() || !h.q[n].m.At.After(redisNow)) {
		n++
	}
	out := map[*store.Lease][]store.Claimed{}
	for _, hm := range h.q[:n] {
		out[hm.lease] = append(out[hm.lease], hm.m)
	}
	h.q = slices.Delete(h.q, 0, n)
	return out
}

// commitDue commits the held messages due within the store's commit lead (on
// Redis's clock as the shard estimates it: offset) and publishes those the
// commit put in flight, each at its due instant (all whose instant has come
// in one publish), handing their acks to keep. A message whose sink the
// gate blocks now is given back instead (the next claim holds it for its
// sink), and one Redis says is not due yet goes back in the queue. It
// returns the earliest time (our clock) a message was parked again for,
// whether a Notify came while it waited for an instant, and updates the
// offset from the commit's Redis time. On error what it took is back in
// the queue. The acks that ride gives (none: a nil lease) go with the
// first commit, which then tells ride's done how it went.
//
// Never early: a message is published when floor says its instant has
// come on Redis's clock, not by the offset, an estimate that may be off by
// half a round trip either way.
func (s *Scheduler) commitDue(ctx context.Context, st *shardState, h *aheadQueue, offset *time.Duration, floor *redisFloor, tr *Trace,
	ride func() (*store.Lease, []store.Done, func(error)), keep func(ds []store.Done, c *store.Lease, at time.Time)) (retryAt time.Time, notified bool, err error) {
	woke := s.p.Clock.Now()
	var committed []heldMsg // in flight now, each published at its instant
	var answered time.Time
	nowOf := map[*store.Lease]time.Time{} // Redis's time in each lease's commit
	for c, ms := range h.take(woke.Add(*offset + s.p.Store.CommitLead())) {
		if err != nil {
			h.insert(c, ms) // after a failed commit: the next try
			continue
		}
		blocked := s.gate.blocked(woke)
		var commit, back []store.Claimed
		for _, m := range ms {
			if m.Message != nil && hasKey(blocked, m.Message.Sink) {
				back = append(back, m)
			} else {
				commit = append(commit, m)
			}
		}
		prev, ds, rode := ride()
		sent := s.p.Clock.Now()
		var redisNow time.Time
		var res []store.Committed
		redisNow, res, _, err = s.p.Store.CommitAfter(ctx, c, commit, back, prev, ds)
		answered = s.p.Clock.Now()
		if rode != nil {
			rode(err)
		}
		if err != nil {
			h.insert(c, ms) // a commit is idempotent: tried again
			continue
		}
		*offset, nowOf[c] = store.Offset(sent, redisNow, answered), redisNow
		floor.observe(redisNow, sent, answered)
		s.p.Metrics.Ahead.WithLabelValues("given_back").Add(float64(len(back)))
		var notYet []store.Claimed
		for i, r := range res {
			switch r {
			case store.InFlight:
				committed = append(committed, heldMsg{lease: c, m: commit[i]})
			case store.NotYet:
				notYet = append(notYet, commit[i])
			default:
				s.p.Metrics.Ahead.WithLabelValues("revoked").Inc()
			}
		}
		h.insert(c, notYet)
		tr.ClaimSent, tr.ClaimAnswered, tr.RedisNow, tr.Offset, tr.Committed = sent, answered, redisNow, *offset, true
	}
	s.p.Metrics.Ahead.WithLabelValues("committed").Add(float64(len(committed)))
	byInstant(committed)
	for i := 0; i < len(committed); {
		if s.sleepUntil(ctx, st, floor.local(committed[i].m.At)) {
			notified = true
		}
		now := s.p.Clock.Now()
		if now.Before(floor.local(committed[i].m.At)) {
			// Stopped past the drain budget before the instant: in flight,
			// the lease brings them back.
			break
		}
		// Everything whose instant has come goes out in one publish (a
		// shard behind its instants catches up in batches).
		leases := map[*store.Lease]*store.Lease{}
		fences := map[*store.Lease]time.Time{}
		var order []*store.Lease
		for ; i < len(committed) && !now.Before(floor.local(committed[i].m.At)); i++ {
			hm := committed[i]
			fire := leases[hm.lease]
			if fire == nil {
				fire = new(store.Lease)
				*fire = *hm.lease
				fire.Messages = nil
				leases[hm.lease] = fire
				fences[fire] = h.fence(hm.lease)
				order = append(order, fire)
			}
			fire.Now = latest(nowOf[hm.lease], hm.m.At)
			fire.Messages = append(fire.Messages, hm.m)
		}
		for _, fire := range order {
			st.publishing()
			ds, again := s.fire(ctx, fire, answered, fences[fire], *offset, tr)
			keep(ds, fire, answered)
			if !again.IsZero() && (retryAt.IsZero() || again.Before(retryAt)) {
				retryAt = again
			}
		}
	}
	h.pruneFences()
	return retryAt, notified, err
}

// redisFloor is the latest time Redis's clock is known to have reached, as
// an instant of ours: Redis read its clock as r in a reply that came at a
// (our clock, monotonic), so its clock reads at least r + (t - a) at our
// t, less what the two clocks may drift apart meanwhile. Of the replies
// seen, it keeps the one that says most; one that contradicts it (Redis
// read a time earlier than the floor for when the command was sent: its
// clock was set back, or the shard moved to another Redis) starts it
// again. It is the shard loop's alone.
type redisFloor struct {
	r, a time.Time
}

// maxDrift is how far apart two clocks may run, each slewed by NTP at most
// 500 ppm (Linux's limit), per unit of time.
const maxDrift = 1e-3

// observe takes Redis's time r from a command sent at sent whose reply
// came at a.
func (f *redisFloor) observe(r, sent, a time.Time) {
	if f.a.IsZero() || r.Before(f.at(sent)) || !r.Before(f.at(a)) {
		f.r, f.a = r, a
	}
}

// at is the floor at our t, on Redis's clock.
func (f *redisFloor) at(t time.Time) time.Time {
	return f.r.Add(time.Duration(float64(t.Sub(f.a)) * (1 - maxDrift)))
}

// local returns the instant of ours from which Redis's clock has reached
// at, for certain.
func (f *redisFloor) local(at time.Time) time.Time {
	return f.a.Add(time.Duration(float64(at.Sub(f.r)) / (1 - maxDrift)))
}

// byInstant orders messages by their due instant, then highest priority
// first, as the queue does.
func byInstant(ms []heldMsg) {
	slices.SortStableFunc(ms, func(a, b heldMsg) int {
		if c := a.m.At.Compare(b.m.At); c != 0 {
			return c
		}
		return priorityOf(b.m) - priorityOf(a.m)
	})
}

// giveBack returns everything held ahead to Redis (a stop): due again at
// once for any instance, rather than at the end of the lease.
func (s *Scheduler) giveBack(ctx context.Context, h *aheadQueue) {
	for c, ms := range h.take(time.Time{}) {
		if _, _, _, err := s.p.Store.CommitAfter(ctx, c, nil, ms, nil, nil); err != nil {
			s.log.Warn("cannot give back messages claimed ahead; their lease brings them back", "shard", c.Shard, "messages", len(ms), "err", err)
			continue
		}
		s.p.Metrics.Ahead.WithLabelValues("given_back").Add(float64(len(ms)))
	}
}

func hasKey(m map[string]int, k string) bool {
	_, ok := m[k]
	return ok
}
