package daemon

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/delaybridge/delaybridge/pkg/store"
)

// redisClock reads the clock every instance shares: this process's clock
// corrected by its measured offset to Redis's. Due times and claims are in
// Redis time; the moment of ingest, from which an x-delay counts when the
// broker records no publish time (RabbitMQ), is read from this clock too,
// so that a daemon whose own clock is wrong neither fires early nor late.
type redisClock struct {
	offset atomic.Int64 // Redis's clock minus ours, in ns
	local  func() time.Time
}

// redisClockRefresh is how often the offset is measured again.
const redisClockRefresh = 10 * time.Second

// Now returns the time on Redis's clock.
func (c *redisClock) Now() time.Time {
	return c.local().Add(time.Duration(c.offset.Load()))
}

// measure takes the offset from a few round trips, keeping the one of the
// shortest (its error is at most half of it).
func (c *redisClock) measure(ctx context.Context, st *store.Store) error {
	var best time.Duration
	bestRTT := time.Duration(-1)
	for range 3 {
		start := time.Now()
		off, err := st.ClockOffset(ctx)
		if err != nil {
			return err
		}
		if rtt := time.Since(start); bestRTT < 0 || rtt < bestRTT {
			best, bestRTT = off, rtt
		}
	}
	// ClockOffset compares with time.Now(); our local clock may be another
	// (a test's skewed one): correct for the difference.
	best += time.Now().Sub(c.local())
	c.offset.Store(int64(best))
	return nil
}

// run measures the offset every redisClockRefresh until ctx ends.
func (c *redisClock) run(ctx context.Context, st *store.Store, log *slog.Logger) {
	t := time.NewTicker(redisClockRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.measure(ctx, st); err != nil && ctx.Err() == nil {
			log.Debug("cannot measure the clock offset to redis; keeping the last one", "err", err)
		}
	}
}
