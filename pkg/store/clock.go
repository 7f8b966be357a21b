package store

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/delaybridge/delaybridge/pkg/lifecycle"
)

// Offset is Redis's clock minus ours, from one round trip: a command sent
// at sent (our clock) whose reply, answered at answered, carries Redis's
// time redisNow. It takes Redis's reading as made halfway through the round
// trip; its error is at most half of it.
//
// The scheduler takes it from each claim's and commit's reply (each carries
// Redis's time to the microsecond), per shard, at no extra round trip,
// because it plans its wake-ups to the due instant: an offset seconds old
// would wake it early or late by what the clocks drifted since, and an
// error either way costs the same. Clock, below, is for what needs Redis's
// time without a claim at hand (the moment of ingest, the admin API), where
// an early reading makes a due time early: it keeps an upper bound of the
// offset instead (Measure).
func Offset(sent, redisNow, answered time.Time) time.Duration {
	return redisNow.Sub(sent.Add(answered.Sub(sent) / 2))
}

// Clock reads the clock every instance shares: this process's clock
// corrected by its measured offset to Redis's. Due times and claims are in
// Redis time; the moment of ingest, from which an x-delay counts when the
// broker records no publish time (RabbitMQ), is read from this clock too,
// so that a daemon whose own clock is wrong neither fires early nor late.
// Now is safe for concurrent use; Measure and Run belong to one goroutine.
type Clock struct {
	store  *Store
	local  func() time.Time
	offset atomic.Int64 // Redis's clock minus ours, in ns
}

// ClockRefresh is how often Clock.Run measures the offset again.
const ClockRefresh = 10 * time.Second

// NewClock returns the shared clock over local, this process's own clock
// (time.Now, or a skewed one in the fault suite). Measure it before use:
// until then it reads local.
func NewClock(s *Store, local func() time.Time) *Clock {
	return &Clock{store: s, local: local}
}

// Now returns the time on Redis's clock.
func (c *Clock) Now() time.Time {
	return c.local().Add(c.Offset())
}

// Offset returns the last measured offset: Redis's clock minus ours.
func (c *Clock) Offset() time.Duration {
	return time.Duration(c.offset.Load())
}

// Measure takes the offset from a few TIME round trips. Redis read its
// clock somewhere within each trip, so a trip bounds the offset from above
// by Redis's time minus when the trip began: Measure keeps the least of
// these bounds. Now is then never behind Redis's clock, however late a
// reply is read (a loaded machine can resume the caller tens of
// milliseconds after Redis answered): a moment of ingest read from it is
// never before the message came, so a delay never ends early. It is ahead
// by at most the shortest trip, a fraction of a millisecond on a quiet
// network.
func (c *Clock) Measure(ctx context.Context) error {
	var best time.Duration
	for i := range 3 {
		sent := c.local()
		t, err := c.store.rdb.Time(ctx).Result()
		if err != nil {
			return fmt.Errorf("store.clock: %w", err)
		}
		if bound := t.Sub(sent); i == 0 || bound < best {
			best = bound
		}
	}
	c.offset.Store(int64(best))
	return nil
}

// Run measures the offset every ClockRefresh until ctx ends; a failed
// measure keeps the last offset.
func (c *Clock) Run(ctx context.Context, log *slog.Logger) {
	lifecycle.Every(ctx, ClockRefresh, func() {
		if err := c.Measure(ctx); err != nil && ctx.Err() == nil {
			log.Debug("cannot measure the clock offset to redis; keeping the last one", "err", err)
		}
	})
}
