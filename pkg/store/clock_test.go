package store_test

import (
	"context"
	"testing"
	"time"

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
