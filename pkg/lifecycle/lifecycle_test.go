package lifecycle

import (
	"context"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	var last time.Duration
	for i := range 10 {
		d := b.Next()
		if d < 75*time.Millisecond || d > 1250*time.Millisecond {
			t.Fatalf("wait %d: %v out of bounds", i, d)
		}
		last = d
	}
	if last < 750*time.Millisecond {
		t.Errorf("after 10 tries the wait is %v, want about Max", last)
	}
	if !b.Failing() {
		t.Error("Failing after Next: false")
	}
	b.Reset()
	if b.Failing() {
		t.Error("Failing after Reset: true")
	}
	if d := b.Next(); d > 125*time.Millisecond {
		t.Errorf("after Reset: %v", d)
	}
	done := make(chan struct{})
	close(done)
	if b.Wait(context.Background(), done) {
		t.Error("Wait with done closed: true")
	}
}

func TestBackoffDelay(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second, Multiplier: 3, Jitter: 0.5}
	cases := []struct {
		attempt int
		r       float64
		want    time.Duration
	}{
		{1, 0.5, 100 * time.Millisecond},
		{2, 0.5, 300 * time.Millisecond},
		{3, 0.5, 900 * time.Millisecond},
		{4, 0, time.Second}, // capped
		{100, 0, time.Second},
		{100, 0.5, 750 * time.Millisecond}, // at the cap the jitter spreads below it
		{100, 1, 500 * time.Millisecond},
		{1, 0, 50 * time.Millisecond},  // -50% jitter
		{1, 1, 150 * time.Millisecond}, // +50% jitter
		{0, 0.5, 100 * time.Millisecond},
	}
	for _, c := range cases {
		if got := b.Delay(c.attempt, c.r); got != c.want {
			t.Errorf("Delay(%d, %v) = %v, want %v", c.attempt, c.r, got, c.want)
		}
	}
}

// The zero fields take the defaults Next has always used: doubling from
// 100ms to 5s, over 75%-125%.
func TestBackoffDefaults(t *testing.T) {
	var b Backoff
	for _, c := range []struct {
		attempt int
		r       float64
		want    time.Duration
	}{
		{1, 0.5, 100 * time.Millisecond},
		{2, 0.5, 200 * time.Millisecond},
		{7, 0, 5 * time.Second},
		{1, 0, 75 * time.Millisecond},
		{1, 1, 125 * time.Millisecond},
	} {
		if got := b.Delay(c.attempt, c.r); got != c.want {
			t.Errorf("Delay(%d, %v) = %v, want %v", c.attempt, c.r, got, c.want)
		}
	}
}

func TestDrainContext(t *testing.T) {
	ctx, stop := context.WithCancel(context.Background())
	work, cancel := DrainContext(ctx, 50*time.Millisecond)
	defer cancel()
	stop()
	if work.Err() != nil {
		t.Fatal("the work context ended with ctx; it should outlive it by the budget")
	}
	select {
	case <-work.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the work context did not end after its budget")
	}

	// Cancelled by its owner before ctx ends: ends at once.
	work2, cancel2 := DrainContext(context.Background(), time.Hour)
	cancel2()
	if work2.Err() == nil {
		t.Error("cancel did not end the work context")
	}
}

// AttemptAfter gives the attempt whose wait is about as long as what was
// waited already, with the defaults of Delay, capped at Max.
func TestAttemptAfterWaitsAboutAsLongAgain(t *testing.T) {
	b := Backoff{Min: 500 * time.Millisecond, Max: 30 * time.Second} // the multiplier's default, 2
	for _, c := range []struct{ waited, lo, hi time.Duration }{
		{0, 500 * time.Millisecond, 500 * time.Millisecond},
		{300 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond},
		{time.Second, time.Second, 2 * time.Second},
		{3 * time.Second, 3 * time.Second, 6 * time.Second},
		{10 * time.Second, 10 * time.Second, 20 * time.Second},
		{time.Hour, 22500 * time.Millisecond, 30 * time.Second}, // at the cap the jitter spreads below it
	} {
		n := b.AttemptAfter(c.waited)
		if d := b.Delay(n, 0.5); d < c.lo || d > c.hi { // r 0.5: no jitter below the cap
			t.Errorf("waited %s: attempt %d, wait %s; want %s to %s", c.waited, n, d, c.lo, c.hi)
		}
	}
}
