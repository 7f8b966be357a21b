package envelope

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
	_ "time/tzdata" // x-delay-timezone works in images without a zoneinfo database

	"github.com/robfig/cron/v3"
)

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
	TimeZone string // IANA zone of Cron; "" is UTC
	// Anchor is, for an every schedule, the due time of occurrence 1; for
	// a cron schedule, occurrence N's own time on the schedule (Following
	// keeps it), so that an occurrence fired or moved early is followed by
	// the one after its own time. A cron series parked by an earlier
	// release keeps its first time here: for its later occurrences the
	// own time is not known, and the next is the first after the one it
	// fires at (scheduled).
	Anchor time.Time
	Until  time.Time // no occurrence after it; zero: no end
	Count  int       // at most this many occurrences; 0: no limit
	N      int       // the occurrence this parked message is, from 1
	Missed Missed    // what firing after downtime does with missed occurrences
	// MissedMax bounds the missed occurrences MissedAll publishes: the
	// most recent ones (route.missed_max); 0 means DefaultMissedMax.
	MissedMax int
	// Parked is when the series was parked (the message's IngestedAt; not
	// stored apart): occurrences due before it are never missed ones, and
	// are passed over, but the one the message is (its first).
	Parked time.Time
}

// DefaultMissedMax is route.missed_max's default.
const DefaultMissedMax = 100

// Missed is the route's policy for occurrences missed while nothing fired
// (route.missed).
type Missed uint8

// Missed policies.
const (
	MissedOnce Missed = iota // fire one occurrence for all that were missed, then go on
	MissedAll                // fire every missed occurrence
	MissedSkip               // fire none of them; go on with the next one in the future
)

// missedNames are route.missed's words for the Missed policies, stated here
// once: the configuration, the views and export all use String and
// ParseMissed.
var missedNames = [...]string{MissedOnce: "once", MissedAll: "all", MissedSkip: "skip"}

// String is route.missed's word for m: once, all or skip.
func (m Missed) String() string {
	if int(m) < len(missedNames) {
		return missedNames[m]
	}
	return fmt.Sprintf("Missed(%d)", uint8(m))
}

// ParseMissed reads a route.missed value: once (the default, ""), all or
// skip.
func ParseMissed(s string) (Missed, error) {
	if s == "" {
		return MissedOnce, nil
	}
	for m, name := range missedNames {
		if s == name {
			return Missed(m), nil
		}
	}
	return 0, fmt.Errorf("%q is not one of %s", s, strings.Join(missedNames[:], ", "))
}

// MinEvery is the shortest x-delay-every that can be allowed
// (limits.min_interval's default and floor): one occurrence per second of
// a series is what a cron of six fields can ask for.
const MinEvery = time.Second

// maxWalk bounds how many occurrences of a cron schedule are walked to
// count them (an every schedule is counted by arithmetic): past it the
// schedule's next time is taken at once, and the occurrence numbers count
// the walked ones only. It bounds what finding the next occurrence costs,
// however far back a series is anchored or however long nothing fired.
const maxWalk = 1000

// cronParser reads 5-field (minute first) and 6-field (seconds first)
// expressions and descriptors (@hourly, @daily...).
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseCron parses an x-delay-cron expression; zone prefixes and @every are
// refused (x-delay-timezone and x-delay-every say those).
func parseCron(spec string) (cron.Schedule, error) {
	s := strings.TrimSpace(spec)
	switch {
	case s == "":
		return nil, fmt.Errorf("is empty")
	case strings.HasPrefix(s, "TZ=") || strings.HasPrefix(s, "CRON_TZ="):
		return nil, fmt.Errorf("%q has a time zone prefix: give the zone in %s instead", printable(spec), HeaderTimeZone)
	case strings.HasPrefix(s, "@every"):
		return nil, fmt.Errorf("%q: use %s for a fixed interval", printable(spec), HeaderEvery)
	}
	sched, err := cronParser.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%q is not a 5- or 6-field cron expression or a descriptor such as @hourly: %s", printable(spec), printable(err.Error()))
	}
	return sched, nil
}

// schedule is a compiled cron schedule with its zone: compiling (parsing
// the expression, loading the zone) costs far more than stepping, so it is
// done once per expression and zone and kept.
type schedule struct {
	cron cron.Schedule
	loc  *time.Location
}

var schedules sync.Map // cron + "\x00" + zone -> *schedule (a nil cron when it does not parse)

func (r *Recurrence) compiled() *schedule {
	key := r.Cron + "\x00" + r.TimeZone
	if s, ok := schedules.Load(key); ok {
		return s.(*schedule)
	}
	s := &schedule{loc: time.UTC}
	s.cron, _ = parseCron(r.Cron)
	if r.TimeZone != "" {
		if loc, err := time.LoadLocation(r.TimeZone); err == nil {
			s.loc = loc // else UTC: checked when parsed; a zone gone from the database since
		}
	}
	v, _ := schedules.LoadOrStore(key, s)
	return v.(*schedule)
}

// after returns the schedule's first time after t, zero when there is none.
func (r *Recurrence) after(t time.Time) time.Time {
	if r.Every > 0 {
		if t.Before(r.Anchor) {
			return r.Anchor
		}
		n := t.Sub(r.Anchor)/r.Every + 1
		return r.Anchor.Add(n * r.Every)
	}
	s := r.compiled()
	if s.cron == nil {
		return time.Time{}
	}
	return cronAfter(s.cron, t, s.loc)
}

// scheduled is where the occurrence this message is (N), due at due, stands
// on the schedule: its own time when a fire or a reschedule moved it
// earlier (an every schedule's by arithmetic, a cron schedule's its
// Anchor), else due.
func (r *Recurrence) scheduled(due time.Time) time.Time {
	at, ok := r.timeOf(r.N)
	if r.Every <= 0 {
		at, ok = r.Anchor, true
	}
	if ok && at.After(due) {
		return at
	}
	return due
}

// timeOf is when an every schedule's occurrence n is due, and false when
// that is past what a time.Time holds from its anchor.
func (r *Recurrence) timeOf(n int) (time.Time, bool) {
	if r.Every <= 0 || n < 1 || int64(n-1) > int64(math.MaxInt64/r.Every) {
		return time.Time{}, false
	}
	return r.Anchor.Add(time.Duration(n-1) * r.Every), true
}

// number is the occurrence number of the schedule's time t, for an every
// schedule (occurrence 1 is the anchor).
func (r *Recurrence) number(t time.Time) int {
	return int(min(t.Sub(r.Anchor)/r.Every, 1<<31-2)) + 1
}

// step returns the first occurrence after t, given that the occurrence due
// at from is number n: its time and number, counted by arithmetic for an
// every schedule and by walking at most maxWalk occurrences for a cron one
// (past that, the next time after t, numbered as the one after the last
// walked).
func (r *Recurrence) step(from time.Time, n int, t time.Time) (time.Time, int) {
	if r.Every > 0 {
		next := r.after(t)
		return next, r.number(next)
	}
	next := r.after(from)
	n++
	for i := 0; !next.IsZero() && !next.After(t); i++ {
		if i == maxWalk {
			return r.after(t), n + 1
		}
		next = r.after(next)
		n++
	}
	return next, n
}

// cronAfter is the cron schedule's first time after t, read on the wall
// clock of loc, so that daylight saving never fires an occurrence twice or
// not at all: a wall time that does not exist (the hour skipped in spring)
// fires when the clock jumps over it, and one that exists twice (the hour
// repeated in autumn) fires the first time.
func cronAfter(sched cron.Schedule, t time.Time, loc *time.Location) time.Time {
	w := t.In(loc)
	wall := time.Date(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), w.Second(), w.Nanosecond(), time.UTC)
	for {
		wall = sched.Next(wall)
		if wall.IsZero() {
			return time.Time{}
		}
		// In the repeated hour, a wall time after t's can be one that
		// first came before t (and fired then): the next one.
		if at := fromWall(wall, loc); at.After(t) {
			return at
		}
	}
}

// fromWall returns the first instant whose wall clock in loc reads the wall
// time w (given in UTC fields), or, when no instant does (a daylight-saving
// gap), the instant the clock jumped over it.
func fromWall(w time.Time, loc *time.Location) time.Time {
	var first time.Time
	for _, probe := range []time.Time{w.Add(-36 * time.Hour), w.Add(36 * time.Hour)} {
		_, off := probe.In(loc).Zone()
		c := w.Add(-time.Duration(off) * time.Second)
		if sameWall(c.In(loc), w) && (first.IsZero() || c.Before(first)) {
			first = c
		}
	}
	if !first.IsZero() {
		return first
	}
	_, off := w.Add(-36 * time.Hour).In(loc).Zone()
	start, _ := w.Add(-time.Duration(off) * time.Second).In(loc).ZoneBounds()
	return start
}

func sameWall(a, w time.Time) bool {
	return a.Year() == w.Year() && a.Month() == w.Month() && a.Day() == w.Day() &&
		a.Hour() == w.Hour() && a.Minute() == w.Minute() && a.Second() == w.Second()
}

// Skip reports whether the occurrence due at due (where it stands on the
// schedule: scheduled) should not be published, fired at now: it fell due after the series was parked and was missed,
// and under the skip policy a later occurrence is already due at now;
// under all, the missed_max most recent are due at now without it (all
// publishes those, the most recent). An occurrence due before the series
// was parked (its first, named by x-deliver-at or x-delay) is never a
// missed one.
func (r *Recurrence) Skip(due, now time.Time) bool {
	due = r.scheduled(due)
	if !r.Parked.IsZero() && !due.After(r.Parked) {
		return false
	}
	want := 1 // of the occurrences after due that the series has, how many must be due at now
	switch r.Missed {
	case MissedSkip:
	case MissedAll:
		want = r.MissedBound()
		if r.Every > 0 { // by arithmetic, however many
			return r.lastBy(now)-r.number(due) >= want
		}
		want = min(want, maxWalk) // a cron schedule is walked, as far as Next walks it
	default:
		return false
	}
	c, n := due, r.N
	for range want {
		c, n = r.after(c), n+1
		if c.IsZero() || c.After(now) || (!r.Until.IsZero() && c.After(r.Until)) || (r.Count > 0 && n > r.Count) {
			return false
		}
	}
	return true
}

// Next returns the occurrence that follows the one due at due, fired at
// now: its due time and number, and false when the series ends (after
// Until, past Count, or a schedule with no next time).
//
// The occurrences due before the series was parked are passed over
// outright (a series anchored in 1970 fires once, then goes on at its next
// time after the parking time). Of those due after parking and missed
// while nothing fired: once and skip pass over them (once fired the one at
// due for them all, skip fires none), all fires each of the MissedMax most
// recent. Finding the next one costs the same however far back the series
// is anchored (step). An occurrence fired before its time (a fire, a
// reschedule earlier) is followed by the next one on the schedule, never
// by itself again (scheduled).
func (r *Recurrence) Next(due, now time.Time) (time.Time, int, bool) {
	due = r.scheduled(due) // fired before its time (fire, reschedule): the next is N+1, on the schedule
	var next time.Time
	var n int
	switch {
	case r.Every > 0:
		from := due
		if from.Before(r.Parked) {
			from = r.Parked // due before parking: passed over
		}
		next = r.after(from)
		n = r.number(next)
	case due.Before(r.Parked):
		// Passed over at once, not walked: a cron schedule's numbers then
		// count from its first occurrence (maxWalk).
		next, n = r.after(r.Parked), r.N+1
	default:
		next, n = r.after(due), r.N+1
	}
	if !next.After(now) { // missed while nothing fired
		keep := r.MissedBound()
		switch {
		case r.Missed != MissedAll:
			next, n = r.step(next, n, now)
		case r.Every > 0:
			if last := r.lastBy(now); last-n+1 > keep {
				// Only the most recent keep of them: the first of those.
				n = last - keep + 1
				next = r.Anchor.Add(time.Duration(n-1) * r.Every)
			}
		default:
			next, n = r.recentCron(next, n, now, keep)
		}
	}
	switch {
	case next.IsZero(),
		!r.Until.IsZero() && next.After(r.Until),
		r.Count > 0 && n > r.Count:
		return time.Time{}, 0, false
	}
	return next.Truncate(time.Millisecond), n, true
}

// Following returns the occurrence that follows the one due at due, fired
// at now (Next): its due time and its schedule, numbered and, for a cron
// schedule, anchored at its own time; false when the series ends.
func (r *Recurrence) Following(due, now time.Time) (time.Time, *Recurrence, bool) {
	next, n, ok := r.Next(due, now)
	if !ok {
		return time.Time{}, nil, false
	}
	f := *r
	f.N = n
	if f.Every <= 0 {
		f.Anchor = next
	}
	return next, &f, true
}

// lastBy is the number of an every schedule's last occurrence due at now
// that the series has (within its until and its count).
func (r *Recurrence) lastBy(now time.Time) int {
	last := r.number(now)
	if !r.Until.IsZero() && r.Until.Before(now) {
		last = r.number(r.Until)
	}
	if r.Count > 0 {
		last = min(last, r.Count)
	}
	return last
}

// MissedBound is the missed_max in force: MissedMax, or DefaultMissedMax
// when it is 0.
func (r *Recurrence) MissedBound() int {
	if r.MissedMax > 0 {
		return r.MissedMax
	}
	return DefaultMissedMax
}

// recentCron is, for a cron schedule whose occurrence next (number n) and
// more until now were missed, the first of the keep most recent of them
// that the series has (within its until and its count; next itself when
// it has none of them). It walks at most maxWalk occurrences from next;
// past that it looks back from now, or from until when that came first,
// in windows that double (a cron schedule has no previous time), and
// numbers from the last walked one.
func (r *Recurrence) recentCron(next time.Time, n int, now time.Time, keep int) (time.Time, int) {
	end := now
	if !r.Until.IsZero() && r.Until.Before(end) {
		end = r.Until
	}
	ring := make([]time.Time, 0, min(keep, maxWalk)) // no more are walked
	t, k := next, n
	for i := 0; !t.IsZero() && !t.After(end) && (r.Count <= 0 || k <= r.Count); i++ {
		if i == maxWalk {
			return r.recentBefore(end, keep), k + 1
		}
		if len(ring) == keep {
			ring = ring[1:]
		}
		ring = append(ring, t)
		t = r.after(t)
		k++
	}
	if len(ring) == 0 {
		return next, n // past until or count: the series ends (Next)
	}
	return ring[0], k - len(ring)
}

// recentBefore is the first of the keep most recent occurrences at or
// before now (of a cron schedule), or the next one after now when there is
// none within a century.
func (r *Recurrence) recentBefore(now time.Time, keep int) time.Time {
	for window := time.Minute; window < 100*365*24*time.Hour; window *= 2 {
		var recent []time.Time
		for x := r.after(now.Add(-window)); !x.IsZero() && !x.After(now); x = r.after(x) {
			if recent = append(recent, x); len(recent) > keep {
				recent = recent[1:]
			}
		}
		if len(recent) == keep {
			return recent[0]
		}
	}
	return r.after(now)
}

// String is the schedule as the API and the CLI show it.
func (r *Recurrence) String() string {
	var b strings.Builder
	if r.Every > 0 {
		b.WriteString("every " + r.Every.String())
	} else {
		b.WriteString("cron " + r.Cron)
		if r.TimeZone != "" {
			b.WriteString(" in " + r.TimeZone)
		}
	}
	if !r.Until.IsZero() {
		b.WriteString(" until " + FormatTime(r.Until))
	}
	if r.Count > 0 {
		b.WriteString(", " + strconv.Itoa(r.Count) + " times")
	}
	return b.String()
}

// recurrence reads the recurring-schedule headers of an incoming message.
// It returns nil when there are none, else the schedule with the due time
// of occurrence 1: the time x-delay or x-deliver-at gave (hasDue), else the
// schedule's first time after base (the publish time). The reason says
// what is wrong, for a rejection.
func recurrence(h Headers, base, due time.Time, hasDue bool, route *Route, parked time.Time, minInterval time.Duration) (r *Recurrence, first time.Time, reason string) {
	minInterval = max(minInterval, MinEvery)
	every, hasEvery := h.Get(HeaderEvery)
	spec, hasCron := h.Get(HeaderCron)
	zone, hasZone := h.Get(HeaderTimeZone)
	until, hasUntil := h.Get(HeaderUntil)
	count, hasCount := h.Get(HeaderCount)
	switch {
	case !hasEvery && !hasCron:
		if hasZone || hasUntil || hasCount {
			return nil, first, fmt.Sprintf("%s, %s or %s given without %s or %s", HeaderTimeZone, HeaderUntil, HeaderCount, HeaderEvery, HeaderCron)
		}
		return nil, first, ""
	case hasEvery && hasCron:
		return nil, first, fmt.Sprintf("both %s and %s given; give one", HeaderEvery, HeaderCron)
	case route.NoRecurring:
		return nil, first, fmt.Sprintf("the route of ingest %q refuses recurring messages (route.recurring: false)", route.Ingest)
	}
	r = &Recurrence{N: 1, Missed: route.Missed, MissedMax: route.MissedMax, Parked: parked}
	if hasEvery {
		d, err := time.ParseDuration(strings.TrimSpace(every))
		switch {
		case err != nil:
			return nil, first, fmt.Sprintf("%s %q is not a duration (1s, 5m, 1h30m)", HeaderEvery, printable(every))
		case d < minInterval:
			return nil, first, fmt.Sprintf("%s %q is shorter than limits.min_interval %s", HeaderEvery, printable(every), minInterval)
		case d%time.Millisecond != 0:
			return nil, first, fmt.Sprintf("%s %q is not a whole number of milliseconds", HeaderEvery, printable(every))
		}
		if hasZone {
			return nil, first, fmt.Sprintf("%s applies to %s only", HeaderTimeZone, HeaderCron)
		}
		r.Every = d
	} else {
		if _, err := parseCron(spec); err != nil {
			return nil, first, fmt.Sprintf("%s %v", HeaderCron, err)
		}
		r.Cron = strings.TrimSpace(spec)
		if hasZone {
			z := strings.TrimSpace(zone)
			if _, err := time.LoadLocation(z); err != nil || z == "" || z == "Local" {
				return nil, first, fmt.Sprintf("%s %q is not an IANA time zone (Europe/Berlin, America/New_York, UTC)", HeaderTimeZone, printable(zone))
			}
			r.TimeZone = z
		}
	}
	if hasUntil {
		t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(until))
		if err != nil {
			return nil, first, fmt.Sprintf("%s %q is not RFC 3339 (2026-12-31T23:59:59Z)", HeaderUntil, printable(until))
		}
		r.Until = t
	}
	if hasCount {
		n, err := strconv.Atoi(strings.TrimSpace(count))
		if err != nil || n < 1 {
			return nil, first, fmt.Sprintf("%s %q is not a whole number of at least 1", HeaderCount, printable(count))
		}
		r.Count = n
	}
	switch {
	case hasDue:
		first = due
	case r.Every > 0:
		first = base.Add(r.Every)
	default:
		first = r.after(base)
		if first.IsZero() {
			return nil, first, fmt.Sprintf("%s %q never fires", HeaderCron, printable(spec))
		}
	}
	if r.Cron != "" {
		if gap := r.shortestGap(base); gap < minInterval {
			return nil, first, fmt.Sprintf("%s %q fires %s apart, more often than limits.min_interval %s allows", HeaderCron, printable(spec), gap, minInterval)
		}
	}
	first = CeilMillis(first)
	if !r.Until.IsZero() && first.After(r.Until) {
		return nil, first, fmt.Sprintf("%s %s is before the first occurrence %s", HeaderUntil, FormatTime(r.Until), FormatTime(first))
	}
	r.Anchor = first
	return r, first, ""
}

// cronGapSample is how many occurrences of a cron shortestGap looks at: a
// schedule's gaps repeat within a day or a week of occurrences, and a
// schedule that fires more often than limits.min_interval does so within
// its first ones.
const cronGapSample = 64

// shortestGap is the shortest time between two of the first
// cronGapSample occurrences of a cron schedule after base; a day when it
// fires less than twice in them.
func (r *Recurrence) shortestGap(base time.Time) time.Duration {
	gap := 24 * time.Hour
	prev := r.after(base)
	for i := 1; i < cronGapSample && !prev.IsZero(); i++ {
		next := r.after(prev)
		if next.IsZero() {
			break
		}
		gap = min(gap, next.Sub(prev))
		prev = next
	}
	return gap
}
