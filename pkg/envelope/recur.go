package envelope

import "time"

// Recurrence is the schedule of a recurring message (x-delay-every or
// x-delay-cron, with x-delay-timezone, x-delay-until and x-delay-count).
// The parked message is its occurrence N; each next time is computed from
// the schedule, never from when an occurrence fired, so a series does not
// drift.
type Recurrence struct {
	// Every is the interval of an x-delay-every schedule: occurrence n is
	// due at Anchor + (n-1) * Every. Zero for a cron schedule.
	Every time.Duration
	// Cron is the x-delay-cron expression (5 or 6 fields, or a descriptor
	// such as @hourly), evaluated in TimeZone. Empty for an every schedule.
	Cron     string
	TimeZone string    // IANA zone of Cron; "" is UTC
	Anchor   time.Time // the due time of occurrence 1
	Until    time.Time // no occurrence after it; zero: no end
	Count    int       // at most this many occurrences; 0: no limit
	N        int       // the occurrence this parked message is, from 1
	Missed   Missed    // what firing after downtime does with missed occurrences
}

// Missed is the route's policy for occurrences missed while nothing fired
// (route.missed).
type Missed uint8

// Missed policies.
const (
	MissedOnce Missed = iota // fire one occurrence for all that were missed, then go on
	MissedAll                // fire every missed occurrence
	MissedSkip               // fire none of them; go on with the next one in the future
)
