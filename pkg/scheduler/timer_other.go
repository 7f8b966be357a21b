//go:build !linux

package scheduler

import "time"

// newPreciseTimer: there is no timerfd here; SystemClock uses Go's timers.
func newPreciseTimer(time.Duration) Timer { return nil }
