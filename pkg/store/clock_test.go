package store_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/store"
)

func TestOffset(t *testing.T) {
	sent := time.Unix(100, 0)
	answered := sent.Add(10 * time.Millisecond)
	redisNow := sent.Add(time.Minute + 5*time.Millisecond) // read halfway: a minute ahead
	if got := store.Offset(sent, redisNow, answered); got != time.Minute {
		t.Fatalf("Offset = %v, want 1m", got)
	}
}

// A process whose own clock is an hour off reads Redis's time from Clock.
func TestClockCorrectsASkewedLocalClock(t *testing.T) {
	s := newStore(t, 1)
	skewed := func() time.Time { return time.Now().Add(time.Hour) }
	c := store.NewClock(s, skewed)
	if err := c.Measure(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The test's Redis runs on this machine: its clock is time.Now's.
	if off := c.Offset(); off > -time.Hour+time.Second || off < -time.Hour-time.Second {
		t.Fatalf("offset %v, want about -1h", off)
	}
	if d := c.Now().Sub(time.Now()); d > time.Second || d < -time.Second {
		t.Fatalf("Now is %v from the wall clock", d)
	}
}

// A reply read late (a loaded machine: the goroutine runs again 30 ms
// after Redis answered) must not put the shared clock behind Redis's: a
// moment of ingest read from it would be before the message came, and
// its delay would end early. Redis read its clock within the round trip,
// so Now may be ahead of Redis's by at most a round trip, never behind.
func TestClockNeverBehindRedisWhenRepliesAreReadLate(t *testing.T) {
	s := newStore(t, 1)
	var late atomic.Bool
	late.Store(true)
	s.Client().AddHook(lateReplies{&late})
	c := store.NewClock(s, time.Now)
	if err := c.Measure(context.Background()); err != nil {
		t.Fatal(err)
	}
	late.Store(false)
	redisNow, err := s.Client().Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	// The test's Redis runs on this machine: the true offset is 0, and
	// Redis's time was read before Now.
	if now := c.Now(); now.Before(redisNow) {
		t.Fatalf("Now %v is %v behind Redis's time read before it (offset %v)", now, redisNow.Sub(now), c.Offset())
	}
	if off := c.Offset(); off < 0 || off > time.Second {
		t.Fatalf("offset %v, want between 0 and a round trip", off)
	}
}

// lateReplies hands each reply to its caller 30 ms after Redis gave it,
// while on: what a machine too loaded to run the caller at once does.
type lateReplies struct{ on *atomic.Bool }

func (lateReplies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h lateReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.on.Load() {
			time.Sleep(30 * time.Millisecond) // the latency injected, not a wait for anything
		}
		return err
	}
}
func (lateReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
