package scheduler

import (
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

func defaultRand() float64 { return rand.Float64() }
