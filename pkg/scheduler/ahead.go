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
// due (Claimed.At), then highest priority first. It is the shard loop's
// alone.
type aheadQueue struct{ q []heldMsg }

func (h *aheadQueue) len() int { return len(h.q) }

// next is when the first held message falls due, on Redis's clock.
func (h *aheadQueue) next() (time.Time, bool) {
	if len(h.q) == 0 {
		return time.Time{}, false
	}
	return h.q[0].m.At, true
}

// add takes the messages of claim c that were claimed ahead into the queue
// and returns a lease of the others, those claimed due (in flight now).
func (h *aheadQueue) add(c *store.Lease) *store.Lease {
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
	h.insert(c, ahead)
	return &due
}

// insert queues messages ms of claim c.
func (h *aheadQueue) insert(c *store.Lease, ms []store.Claimed) {
	if len(ms) == 0 {
		return
	}
	for _, m := range ms {
		h.q = append(h.q, heldMsg{lease: c, m: m})
	}
	slices.SortStableFunc(h.q, func(a, b heldMsg) int {
		if c := a.m.At.Compare(b.m.At); c != 0 {
			return c
		}
		return priorityOf(b.m) - priorityOf(a.m)
	})
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

// commitDue commits the held messages due now (on Redis's clock as the
// shard estimates it: offset) and fires those the commit put in flight,
// handing their acks to keep. A message whose sink the gate blocks now is
// given back instead (the next claim holds it for its sink), and one Redis
// says is not due yet goes back in the queue. It returns the earliest time
// (our clock) a message was parked again for, and updates the offset from
// the commit's Redis time. On error what it took is back in the queue.
func (s *Scheduler) commitDue(ctx context.Context, h *aheadQueue, offset *time.Duration, tr *Trace,
	keep func(ds []store.Done, c *store.Lease, at time.Time)) (retryAt time.Time, err error) {
	woke := s.p.Clock.Now()
	for c, ms := range h.take(woke.Add(*offset)) {
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
		sent := s.p.Clock.Now()
		var redisNow time.Time
		var res []store.Committed
		redisNow, res, err = s.p.Store.Commit(ctx, c, commit, back)
		answered := s.p.Clock.Now()
		if err != nil {
			h.insert(c, ms) // a commit is idempotent: tried again
			continue
		}
		*offset = store.Offset(sent, redisNow, answered)
		s.p.Metrics.Ahead.WithLabelValues("given_back").Add(float64(len(back)))
		fire := *c
		fire.Now, fire.Messages = redisNow, nil
		var notYet []store.Claimed
		for i, r := range res {
			switch r {
			case store.InFlight:
				fire.Messages = append(fire.Messages, commit[i])
			case store.NotYet:
				notYet = append(notYet, commit[i])
			default:
				s.p.Metrics.Ahead.WithLabelValues("revoked").Inc()
			}
		}
		h.insert(c, notYet)
		if len(fire.Messages) == 0 {
			continue
		}
		s.p.Metrics.Ahead.WithLabelValues("committed").Add(float64(len(fire.Messages)))
		tr.ClaimSent, tr.ClaimAnswered, tr.RedisNow, tr.Offset, tr.Committed = sent, answered, redisNow, *offset, true
		ds, again := s.fire(ctx, &fire, answered, *offset, tr)
		keep(ds, &fire, answered)
		if !again.IsZero() && (retryAt.IsZero() || again.Before(retryAt)) {
			retryAt = again
		}
	}
	return retryAt, err
}

// giveBack returns everything held ahead to Redis (a stop): due again at
// once for any instance, rather than at the end of the lease.
func (s *Scheduler) giveBack(ctx context.Context, h *aheadQueue) {
	for c, ms := range h.take(time.Time{}) {
		if _, _, err := s.p.Store.Commit(ctx, c, nil, ms); err != nil {
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
