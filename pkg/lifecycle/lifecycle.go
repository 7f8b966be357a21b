// Package lifecycle holds what delaybridge's background components share
// about running and stopping: the back-off between attempts of an operation
// that failed for a reason outside the message (Redis unreachable, a broker
// restarting), and the context that lets work already started finish after a
// stop was asked for.
package lifecycle

import (
	"context"
	"math"
	"math/rand/v2"
	"time"
)

// Backoff is an exponential back-off with jitter: the wait after the nth
// failure is Min * Multiplier^(n-1), capped at Max, then spread by ±Jitter
// of itself (a fraction) so that what failed together does not retry in
// step, never past Max (at Max, over Max*(1-Jitter) to Max). A zero field
// takes its default: Min 100ms, Max 5s, Multiplier 2, Jitter 0.25; the
// zero value waits 100ms to 5s, doubling, over 75%-125% (75%-100% at Max).
//
// It has two uses. Delay computes the wait of a given attempt and keeps no
// state: the scheduler's back-off between the publish attempts of a message
// (scheduler.backoff), whose attempt count is stored with the message.
// Next, Reset, Failing and Wait count the failures of an operation retried
// in a loop (Redis unreachable, a broker restarting); so used, a Backoff
// belongs to one goroutine.
type Backoff struct {
	Min, Max   time.Duration
	Multiplier float64
	Jitter     float64
	n          int
}

// defaults returns b's fields, each zero one its default.
func (b Backoff) defaults() (lo, hi time.Duration, mult, jitter float64) {
	lo, hi, mult, jitter = b.Min, b.Max, b.Multiplier, b.Jitter
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	if hi <= 0 {
		hi = 5 * time.Second
	}
	if mult == 0 {
		mult = 2
	}
	if jitter == 0 {
		jitter = 0.25
	}
	return lo, hi, mult, jitter
}

// AttemptAfter returns the attempt whose wait (before its jitter) is the
// first as long as waited, capped at Max (at least 1): a wait of about as
// long again as what was waited already.
func (b Backoff) AttemptAfter(waited time.Duration) int {
	lo, hi, mult, _ := b.defaults()
	n, d := 1, float64(lo)
	for d < float64(min(waited, hi)) && mult > 1 && n < 64 {
		d *= mult
		n++
	}
	return n
}

// Delay returns the wait after the given failed attempt (from 1); r is a
// random number in [0, 1) that places it within the jitter.
func (b Backoff) Delay(attempt int, r float64) time.Duration {
	lo, hi, mult, jitter := b.defaults()
	if attempt < 1 {
		attempt = 1
	}
	d := float64(lo) * math.Pow(mult, float64(attempt-1))
	if d > float64(hi) || math.IsInf(d, 0) || math.IsNaN(d) {
		d = float64(hi)
	}
	if d >= float64(hi) {
		// At the cap the waits spread below it, never past it.
		d *= 1 - jitter*r
	} else {
		d = min(d*(1+jitter*(2*r-1)), float64(hi))
	}
	if d < 0 {
		d = 0
	}
	return time.Duration(d)
}

// Next returns the next wait of the operation.
func (b *Backoff) Next() time.Duration {
	b.n++
	return b.Delay(b.n, rand.Float64())
}

// Reset starts over at Min, after a success.
func (b *Backoff) Reset() { b.n = 0 }

// Failing reports whether Next was called since the last Reset.
func (b *Backoff) Failing() bool { return b.n > 0 }

// Wait sleeps for the next wait; it returns false when ctx ends or done is
// closed first (done may be nil).
func (b *Backoff) Wait(ctx context.Context, done <-chan struct{}) bool {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	case <-ctx.Done():
		return false
	}
}

// DrainContext returns the context of work already under way when ctx
// ends: it lives on after ctx, for at most budget more, so that a stop
// lets messages in hand be parked, published and acknowledged. Call
// cancel when the work is done.
func DrainContext(ctx context.Context, budget time.Duration) (work context.Context, cancel context.CancelFunc) {
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(budget, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	return work, func() { stop(); cancelWork() }
}

// Every calls f each d on the wall clock until ctx ends.
func Every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f()
	}
}
