package scheduler

import (
	"math"
	"math/rand/v2"
	"time"
)

// Clock is the scheduler's source of local time and timers, injected so that
// its logic is tested without waiting.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer the scheduler uses.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// NewTimer returns a timer that fires after d: on Linux a timerfd, which
// ends microseconds after d where Go's timer ends up to a millisecond late
// (timer_linux.go); elsewhere a time.Timer.
func (SystemClock) NewTimer(d time.Duration) Timer {
	if !goTimers {
		if t := newPreciseTimer(d); t != nil {
			return t
		}
	}
	return sysTimer{time.NewTimer(d)}
}

// goTimers makes SystemClock use Go's timers everywhere (set by tests, to
// compare).
var goTimers bool

type sysTimer struct{ t *time.Timer }

func (t sysTimer) C() <-chan time.Time { return t.t.C }
func (t sysTimer) Stop() bool          { return t.t.Stop() }

// Backoff is the delay before a failed publish is tried again:
// Initial * Multiplier^(attempt-1), capped at Max, then spread by ±Jitter
// (a fraction) so that messages that failed together do not retry together.
type Backoff struct {
	Initial    time.Duration
	Max        time.Duration
	Multiplier float64
	Jitter     float64
}

// Delay returns the back-off after the given failed attempt (from 1); r is a
// random number in [0, 1).
func (b Backoff) Delay(attempt int, r float64) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := float64(b.Initial) * math.Pow(b.Multiplier, float64(attempt-1))
	if d > float64(b.Max) || math.IsInf(d, 0) || math.IsNaN(d) {
		d = float64(b.Max)
	}
	d *= 1 + b.Jitter*(2*r-1)
	if d < 0 {
		d = 0
	}
	return time.Duration(d)
}

func defaultRand() float64 { return rand.Float64() }
