// Package lifecycle holds what delaybridge's background components share
// about running and stopping: the back-off between attempts of an operation
// that failed for a reason outside the message (Redis unreachable, a broker
// restarting), and the context that lets work already started finish after a
// stop was asked for.
package lifecycle

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is an exponential back-off with jitter: Min, doubling up to Max,
// each wait spread over 75%-125% so that many clients do not retry in step.
// The zero value waits 100ms to 5s. A Backoff is used by one goroutine.
type Backoff struct {
	Min, Max time.Duration
	n        int
}

// Next returns the next wait.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	if hi <= 0 {
		hi = 5 * time.Second
	}
	d := lo << min(b.n, 16)
	if d > hi || d <= 0 {
		d = hi
	}
	b.n++
	return d*3/4 + rand.N(d/2+1)
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
