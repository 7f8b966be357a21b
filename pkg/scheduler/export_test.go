package scheduler

// UseGoTimers makes SystemClock use Go's timers instead of timerfds, for
// the precision breakdown's comparison.
func UseGoTimers(on bool) { goTimers = on }
