package envelope

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// x-delay-every: occurrence n is due at start + (n-1) * every, however late
// each one fired: no drift over 1,000 occurrences.
func TestEveryDoesNotDrift(t *testing.T) {
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	r := &Recurrence{Every: time.Second, Anchor: start, N: 1, Missed: MissedAll}
	due := start
	for n := 2; n <= 1000; n++ {
		fired := due.Add(time.Duration(n%7) * 3 * time.Millisecond) // each one fired a little late
		next, got, ok := r.Next(due, fired)
		if !ok || got != n || !next.Equal(start.Add(time.Duration(n-1)*time.Second)) {
			t.Fatalf("occurrence %d: %v #%d %v, want %v", n, next, got, ok, start.Add(time.Duration(n-1)*time.Second))
		}
		r.N, due = got, next
	}
}

// An every schedule's occurrence fired or rescheduled before its time is
// followed by the next one on the schedule: not by itself again (a fire
// published occurrence 1 twice), not by one further on.
func TestEveryFiredEarly(t *testing.T) {
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name     string
		n        int
		due, now time.Time // the occurrence's due time as changed, and when it fires
		wantNext time.Time
		wantN    int
	}{
		{"first fired 5 s early", 1, start.Add(-5 * time.Second), start.Add(-5 * time.Second), start.Add(3 * time.Second), 2},
		{"first rescheduled 7 s earlier", 1, start.Add(-7 * time.Second), start.Add(-7 * time.Second), start.Add(3 * time.Second), 2},
		{"second fired 1 s early", 2, start.Add(2 * time.Second), start.Add(2 * time.Second), start.Add(6 * time.Second), 3},
		{"first rescheduled 1.5 s later", 1, start.Add(1500 * time.Millisecond), start.Add(1500 * time.Millisecond), start.Add(3 * time.Second), 2},
		{"on time", 1, start, start, start.Add(3 * time.Second), 2},
	} {
		r := &Recurrence{Every: 3 * time.Second, Anchor: start, N: c.n, Count: 3}
		next, n, ok := r.Next(c.due, c.now)
		if !ok || n != c.wantN || !next.Equal(c.wantNext) {
			t.Errorf("%s: next %v #%d %v, want %v #%d", c.name, next, n, ok, c.wantNext, c.wantN)
		}
	}
	cr := &Recurrence{Cron: "0 9 * * *", Anchor: time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC), N: 1}
	fired := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	if next, n, ok := cr.Next(fired, fired); !ok || n != 2 || !next.Equal(cr.Anchor.Add(24*time.Hour)) {
		t.Errorf("cron's first occurrence fired an hour early: next %v #%d %v, want %v #2", next, n, ok, cr.Anchor.Add(24*time.Hour))
	}
	// Moved an hour earlier and claimed only after its own time: it is not
	// a missed occurrence to pass over, under any policy.
	for _, m := range []Missed{MissedAll, MissedSkip} {
		for _, r := range []*Recurrence{
			{Every: time.Hour, Anchor: cr.Anchor, N: 1, Missed: m, MissedMax: 1},
			{Cron: "0 9 * * *", Anchor: cr.Anchor, N: 1, Missed: m, MissedMax: 1},
		} {
			if r.Skip(fired, cr.Anchor.Add(30*time.Minute)) {
				t.Errorf("%s, missed %s: the first occurrence moved early and claimed late is skipped", r, m)
			}
		}
	}
	r := &Recurrence{Every: time.Hour, Anchor: start, N: 1 << 40} // past what a time holds: as before
	if _, _, ok := r.Next(start, start); !ok {
		t.Error("an occurrence number past the range of a time ends the series")
	}
}

// A cron occurrence after the first, fired or moved before its time, is
// followed by the schedule's next time after its own, not by its own time
// again: Following keeps each occurrence's own time in Anchor.
func TestCronFiredEarly(t *testing.T) {
	day := func(d, h int) time.Time { return time.Date(2026, 12, d, h, 0, 0, 0, time.UTC) }
	r := &Recurrence{Cron: "0 9 * * *", Anchor: day(2, 9), N: 1}
	due, second, ok := r.Following(day(2, 9), day(2, 9))
	if !ok || second.N != 2 || !due.Equal(day(3, 9)) || !second.Anchor.Equal(day(3, 9)) {
		t.Fatalf("after the first: %v %+v %v, want occurrence 2 at and anchored %v", due, second, ok, day(3, 9))
	}
	for _, c := range []struct {
		name     string
		due, now time.Time
	}{
		{"fired an hour early", day(3, 8), day(3, 8)},
		{"rescheduled to the day before", day(2, 12), day(2, 12)},
		{"moved an hour earlier, claimed after its own time", day(3, 8), day(3, 9).Add(time.Minute)},
	} {
		next, third, ok := second.Following(c.due, c.now)
		if !ok || third.N != 3 || !next.Equal(day(4, 9)) {
			t.Errorf("occurrence 2 %s: next %v %+v %v, want occurrence 3 at %v", c.name, next, third, ok, day(4, 9))
		}
		if second.Skip(c.due, c.now) {
			t.Errorf("occurrence 2 %s: skipped as missed", c.name)
		}
	}
	// Moved later, past its own time: followed by the first time after
	// where it fired, as an every occurrence is.
	if next, _, _ := second.Following(day(4, 10), day(4, 10)); !next.Equal(day(5, 9)) {
		t.Errorf("occurrence 2 moved a day later: next %v, want %v", next, day(5, 9))
	}
	// Parked by an earlier release, the anchor is the first occurrence's
	// time: fired early, the next is the first time after it fired, as
	// that release had it (its own time is not known).
	old := &Recurrence{Cron: "0 9 * * *", Anchor: day(2, 9), N: 2}
	if next, _, _ := old.Following(day(3, 8), day(3, 8)); !next.Equal(day(3, 9)) {
		t.Errorf("an earlier release's occurrence 2 fired early: next %v, want %v", next, day(3, 9))
	}
	// An every schedule's anchor stays occurrence 1's.
	e := &Recurrence{Every: time.Hour, Anchor: day(2, 9), N: 1}
	if _, f, _ := e.Following(day(2, 9), day(2, 9)); f.N != 2 || !f.Anchor.Equal(day(2, 9)) {
		t.Errorf("every: %+v, want occurrence 2 anchored at %v", f, day(2, 9))
	}
}

// After downtime: once fires one occurrence and goes on with the first one
// in the future; all fires each missed one; skip publishes none of them.
func TestMissedPolicies(t *testing.T) {
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	now := start.Add(10*time.Minute + 30*time.Second) // down for 10 minutes
	for _, c := range []struct {
		missed   Missed
		wantNext time.Time
		wantN    int
		skip     bool
	}{
		{MissedOnce, start.Add(11 * time.Minute), 12, false},
		{MissedAll, start.Add(time.Minute), 2, false},
		{MissedSkip, start.Add(11 * time.Minute), 12, true},
	} {
		r := &Recurrence{Every: time.Minute, Anchor: start, N: 1, Missed: c.missed}
		if got := r.Skip(start, now); got != c.skip {
			t.Errorf("%d: Skip = %v, want %v", c.missed, got, c.skip)
		}
		next, n, ok := r.Next(start, now)
		if !ok || !next.Equal(c.wantNext) || n != c.wantN {
			t.Errorf("%d: next %v #%d %v, want %v #%d", c.missed, next, n, ok, c.wantNext, c.wantN)
		}
	}
	// A late occurrence within one interval is only late, not missed.
	r := &Recurrence{Every: time.Minute, Anchor: start, N: 1, Missed: MissedSkip}
	if r.Skip(start, start.Add(30*time.Second)) {
		t.Error("an occurrence 30 s late is skipped")
	}
}

// Until and Count end a series.
func TestSeriesEnds(t *testing.T) {
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	r := &Recurrence{Every: time.Hour, Anchor: start, N: 2, Count: 3}
	if _, n, ok := r.Next(start.Add(time.Hour), start.Add(time.Hour)); !ok || n != 3 {
		t.Fatalf("third of three: %d %v", n, ok)
	}
	r.N = 3
	if _, _, ok := r.Next(start.Add(2*time.Hour), start.Add(2*time.Hour)); ok {
		t.Fatal("a fourth occurrence of three")
	}
	r = &Recurrence{Every: time.Hour, Anchor: start, N: 1, Until: start.Add(90 * time.Minute)}
	if _, _, ok := r.Next(start, start); !ok {
		t.Fatal("the second occurrence (before until) ends the series")
	}
	r.N = 2
	if _, _, ok := r.Next(start.Add(time.Hour), start.Add(time.Hour)); ok {
		t.Fatal("an occurrence after until")
	}
}

// Daylight saving in Europe/Berlin (2026: 29 March 02:00 -> 03:00, 25
// October 03:00 -> 02:00): a daily 02:30 fires once at 03:00 on the day the
// hour is skipped, and once (the first 02:30) on the day it is repeated.
func TestCronDaylightSaving(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	r := &Recurrence{Cron: "30 2 * * *", TimeZone: "Europe/Berlin", N: 1, Missed: MissedAll}
	walk := func(from time.Time, days int) []time.Time {
		var out []time.Time
		due := from
		for range days {
			next, n, ok := r.Next(due, due)
			if !ok {
				t.Fatal("series ended")
			}
			r.N, due = n, next
			out = append(out, next)
		}
		return out
	}
	spring := walk(time.Date(2026, 3, 27, 2, 30, 0, 0, berlin), 3)
	want := []time.Time{
		time.Date(2026, 3, 28, 2, 30, 0, 0, berlin),
		time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC), // 03:00 CEST, when the clock jumped over 02:30
		time.Date(2026, 3, 30, 2, 30, 0, 0, berlin),
	}
	for i := range want {
		if !spring[i].Equal(want[i]) {
			t.Errorf("spring #%d: %v, want %v", i, spring[i].In(berlin), want[i].In(berlin))
		}
	}
	autumn := walk(time.Date(2026, 10, 24, 2, 30, 0, 0, berlin), 2)
	wantAutumn := []time.Time{
		time.Date(2026, 10, 25, 0, 30, 0, 0, time.UTC), // the first 02:30, CEST
		time.Date(2026, 10, 26, 2, 30, 0, 0, berlin),
	}
	for i := range wantAutumn {
		if !autumn[i].Equal(wantAutumn[i]) {
			t.Errorf("autumn #%d: %v, want %v", i, autumn[i].In(berlin), wantAutumn[i].In(berlin))
		}
	}
}

// The schedule's first time after t is after t for every t of a night
// with the clock put back, the repeated hour included: an hourly schedule
// fires at the first 02:30 of the two, and from the second 02:10 its next
// time is 03:30, not the first 02:30 again, which is past.
func TestCronAfterIsAfter(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	r := &Recurrence{Cron: "30 * * * *", TimeZone: "Europe/Berlin"}
	start := time.Date(2026, 10, 24, 23, 0, 0, 0, time.UTC) // 01:00 CEST, two hours before the clock goes back
	for at := start; at.Before(start.Add(4 * time.Hour)); at = at.Add(time.Minute) {
		if next := r.after(at); !next.After(at) {
			t.Fatalf("after %v (%v): %v (%v), not after it", at, at.In(berlin), next, next.In(berlin))
		}
	}
	second0210 := time.Date(2026, 10, 25, 1, 10, 0, 0, time.UTC) // 02:10 CET, the repeated hour
	if next, want := r.after(second0210), time.Date(2026, 10, 25, 2, 30, 0, 0, time.UTC); !next.Equal(want) {
		t.Errorf("after the second 02:10: %v, want 03:30 CET (%v)", next.In(berlin), want.In(berlin))
	}
}

// The recurring headers, good and bad.
func TestParseRecurring(t *testing.T) {
	pub := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	parseAt := func(h Headers) Decision {
		return Parse(&Incoming{Headers: h, PublishedAt: pub}, testRoute(), testLimits, pub, nil)
	}
	// every without a delay: the first occurrence one interval after publishing.
	d := parseAt(hdrs(HeaderEvery, "5m"))
	m := mustPark(t, d)
	if m.Recur == nil || m.Recur.Every != 5*time.Minute || !m.DueAt.Equal(pub.Add(5*time.Minute)) || m.Recur.N != 1 {
		t.Fatalf("every: %+v due %v", m.Recur, m.DueAt)
	}
	// with x-delay: the first occurrence then.
	m = mustPark(t, parseAt(hdrs(HeaderEvery, "1h", HeaderDelay, "10s")))
	if !m.DueAt.Equal(pub.Add(10*time.Second)) || !m.Recur.Anchor.Equal(m.DueAt) {
		t.Fatalf("every with x-delay: due %v anchor %v", m.DueAt, m.Recur.Anchor)
	}
	// cron: the first time after publishing, in its zone.
	m = mustPark(t, parseAt(hdrs(HeaderCron, "0 9 * * *", HeaderTimeZone, "America/New_York", HeaderCount, "3")))
	ny, _ := time.LoadLocation("America/New_York")
	if want := time.Date(2026, 12, 1, 9, 0, 0, 0, ny); !m.DueAt.Equal(want) || m.Recur.Count != 3 {
		t.Fatalf("cron: due %v, want %v (count %d)", m.DueAt, want, m.Recur.Count)
	}
	if _, ok := m.Headers.Get(HeaderCron); ok {
		t.Fatal("x-delay-cron is forwarded")
	}
	for _, c := range []struct {
		h    Headers
		want string
	}{
		{hdrs(HeaderEvery, "0s"), "shorter than limits.min_interval 1s"},
		{hdrs(HeaderEvery, "500ms"), "shorter than limits.min_interval 1s"},
		{hdrs(HeaderEvery, "soon"), "not a duration"},
		{hdrs(HeaderCron, "0 0 30 2 *"), "never fires"},
		{hdrs(HeaderCron, "61 * * * *"), "not a 5- or 6-field cron"},
		{hdrs(HeaderCron, "TZ=UTC 0 * * * *"), "time zone prefix"},
		{hdrs(HeaderCron, "CRON_TZ=UTC"), "time zone prefix"},
		{hdrs(HeaderCron, "@every 1m"), "x-delay-every"},
		{hdrs(HeaderCron, "@hourly", HeaderTimeZone, "Mars/Olympus"), "not an IANA time zone"},
		{hdrs(HeaderEvery, "1m", HeaderCron, "@hourly"), "both"},
		{hdrs(HeaderEvery, "1m", HeaderCount, "0"), "at least 1"},
		{hdrs(HeaderEvery, "1m", HeaderCount, "-2"), "at least 1"},
		{hdrs(HeaderEvery, "1m", HeaderUntil, "tomorrow"), "not RFC 3339"},
		{hdrs(HeaderEvery, "1h", HeaderUntil, "2026-12-01T10:30:00Z"), "before the first occurrence"},
		{hdrs(HeaderCount, "3"), "without x-delay-every or x-delay-cron"},
		{hdrs(HeaderEvery, "1m", HeaderTimeZone, "UTC"), "applies to x-delay-cron only"},
	} {
		d := parseAt(c.h)
		if d.Action != Reject || !strings.Contains(why(d), c.want) || CodeOf(d.Err) != CodeInvalidSchedule {
			t.Errorf("%v: %v %q (%s), want a rejection saying %q", c.h, d.Action, why(d), CodeOf(d.Err), c.want)
		}
	}
}

// Groups and group cancels.
func TestParseGroups(t *testing.T) {
	m := mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1s", HeaderGroup, "order-42")}))
	if m.Group != "order-42" {
		t.Fatalf("group %q", m.Group)
	}
	if _, ok := m.Headers.Get(HeaderGroup); ok {
		t.Fatal("x-delay-group is forwarded")
	}
	d := parse(t, &Incoming{Headers: hdrs(HeaderCancelGroup, "order-42")})
	if d.Action != CancelGroup || d.Group != "order-42" {
		t.Fatalf("cancel group: %v %q", d.Action, d.Group)
	}
	for _, h := range []Headers{hdrs(HeaderDelay, "1s", HeaderGroup, ""), hdrs(HeaderCancelGroup, "a\x01b")} {
		if d := parse(t, &Incoming{Headers: h}); d.Action != Reject || CodeOf(d.Err) != CodeInvalidGroup {
			t.Errorf("%v: %v %q, want a rejection", h, d.Action, why(d))
		}
	}
}

// Due times never fall before the instant named: sub-millisecond digits
// round up, from x-deliver-at and from a JetStream publish time.
func TestNeverEarly(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	d := Parse(&Incoming{Headers: hdrs(HeaderDeliverAt, "2026-12-01T10:00:05.0000001Z")}, testRoute(), testLimits, now, nil)
	if m := mustPark(t, d); !m.DueAt.Equal(time.Date(2026, 12, 1, 10, 0, 5, 1e6, time.UTC)) {
		t.Fatalf("x-deliver-at: %v", m.DueAt)
	}
	pub := now.Add(-123456 * time.Nanosecond)
	d = Parse(&Incoming{Headers: hdrs(HeaderDelay, "5ms"), PublishedAt: pub}, testRoute(), testLimits, now, nil)
	if m := mustPark(t, d); m.DueAt.Before(pub.Add(5*time.Millisecond)) || m.DueAt.Sub(pub.Add(5*time.Millisecond)) >= time.Millisecond {
		t.Fatalf("x-delay from a publish time with nanoseconds: %v", m.DueAt)
	}
}

// Recurring schedules have bounds (docs/reference.md): a series
// anchored in 1970 fires its first occurrence once, then goes on at its
// next time after it was parked, numbered from the anchor; only what fell
// due after parking can be missed, and all publishes the missed_max most
// recent of those.
func TestSeriesAnchoredInThePast(t *testing.T) {
	parked := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	anchor := time.Unix(0, 0).UTC()
	for _, missed := range []Missed{MissedOnce, MissedAll, MissedSkip} {
		r := &Recurrence{Every: time.Second, Anchor: anchor, N: 1, Missed: missed, Parked: parked}
		if r.Skip(anchor, parked) {
			t.Errorf("%d: the first occurrence, due before parking, is skipped", missed)
		}
		next, n, ok := r.Next(anchor, parked)
		wantN := int(parked.Sub(anchor)/time.Second) + 2
		if !ok || !next.Equal(parked.Add(time.Second)) || n != wantN {
			t.Errorf("%d: after the 1970 occurrence: %v #%d %v, want %v #%d", missed, next, n, ok, parked.Add(time.Second), wantN)
		}
	}
	// Ten minutes down after parking: all publishes the 100 most recent.
	r := &Recurrence{Every: time.Second, Anchor: anchor, N: 1, Missed: MissedAll, MissedMax: 100, Parked: parked}
	due := parked.Add(time.Second)
	r.N = int(due.Sub(anchor)/time.Second) + 1
	now := due.Add(10 * time.Minute)
	next, n, ok := r.Next(due, now)
	if !ok || !next.Equal(now.Add(-99*time.Second)) || n != int(next.Sub(anchor)/time.Second)+1 {
		t.Fatalf("missed all after downtime: %v #%d %v, want %v", next, n, ok, now.Add(-99*time.Second))
	}
	// ... and not the one at due, the oldest missed: 100 in all, not 101.
	if !r.Skip(due, now) {
		t.Error("missed all: the oldest missed occurrence, 600 before the 100 most recent, is published")
	}
	for _, c := range []struct {
		after time.Duration
		skip  bool
	}{{99 * time.Second, false}, {100 * time.Second, true}, {500 * time.Millisecond, false}} {
		if got := r.Skip(due, due.Add(c.after)); got != c.skip {
			t.Errorf("missed all, fired %v after due: Skip %v, want %v", c.after, got, c.skip)
		}
	}
	// The same for a cron schedule in a zone with daylight saving.
	c := &Recurrence{Cron: "* * * * * *", TimeZone: "America/New_York", Anchor: anchor, N: 1, Missed: MissedAll, MissedMax: 100, Parked: parked}
	next, _, ok = c.Next(anchor, parked)
	if !ok || !next.Equal(parked.Add(time.Second)) {
		t.Fatalf("cron after the 1970 occurrence: %v %v", next, ok)
	}
	next, _, ok = c.Next(parked.Add(time.Second), now)
	if !ok || !next.Equal(now.Add(-99*time.Second)) {
		t.Fatalf("cron, missed all after downtime: %v %v, want %v", next, ok, now.Add(-99*time.Second))
	}
	if !c.Skip(parked.Add(time.Second), now) || c.Skip(parked.Add(time.Second), parked.Add(100*time.Second)) {
		t.Error("cron, missed all: the oldest missed is published past the 100 most recent, or skipped within them")
	}
	// ... counting only the occurrences the series has (its count, its
	// until): with fewer than missed_max left, the one at due is published.
	counted := *r
	counted.Count = r.N + 3
	if counted.Skip(due, now) {
		t.Error("missed all: an occurrence skipped although its series has only 3 more")
	}
	if next, n, ok := counted.Next(due, now); !ok || n != r.N+1 || !next.Equal(due.Add(time.Second)) {
		t.Errorf("missed all with 3 more to go: next %v #%d %v, want the one after due", next, n, ok)
	}
	until := *r
	until.Until = due.Add(5 * time.Second)
	if until.Skip(due, now) {
		t.Error("missed all: an occurrence skipped although its series ends 5 s later")
	}
	// Skip: an occurrence due after parking and overtaken is skipped.
	s := &Recurrence{Every: time.Second, Anchor: anchor, N: 1, Missed: MissedSkip, Parked: parked}
	if !s.Skip(parked.Add(time.Second), parked.Add(5*time.Second)) {
		t.Error("an occurrence missed after parking is not skipped")
	}
}

// BenchmarkNextAnchored: finding the next occurrence costs the same
// however far back the series is anchored: a cron message anchored in 1970
// must not cost more CPU than one anchored now.
func BenchmarkNextAnchored(b *testing.B) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name   string
		anchor time.Time
	}{{"1970", time.Unix(0, 0).UTC()}, {"now", now}} {
		for _, missed := range []Missed{MissedOnce, MissedAll} {
			b.Run(fmt.Sprintf("cron_every_second_new_york/anchored_%s/missed_%d", c.name, missed), func(b *testing.B) {
				for b.Loop() {
					r := &Recurrence{Cron: "* * * * * *", TimeZone: "America/New_York", Anchor: c.anchor, N: 1, Missed: missed, Parked: now}
					if _, _, ok := r.Next(c.anchor, now.Add(time.Minute)); !ok {
						b.Fatal("no next")
					}
				}
			})
		}
	}
}

// Each policy's word reads back as the policy, and nothing else is one.
func TestMissedNames(t *testing.T) {
	for m := MissedOnce; m <= MissedSkip; m++ {
		if got, err := ParseMissed(m.String()); err != nil || got != m {
			t.Errorf("ParseMissed(%q) = %v, %v; want %v", m.String(), got, err, m)
		}
	}
	if m, err := ParseMissed(""); err != nil || m != MissedOnce {
		t.Errorf(`ParseMissed("") = %v, %v; want once, the default`, m, err)
	}
	if _, err := ParseMissed("Missed(3)"); err == nil || err.Error() != `"Missed(3)" is not one of once, all, skip` {
		t.Errorf("an unknown policy: %v", err)
	}
	if got := Missed(MissedSkip + 1).String(); got != "Missed(3)" {
		t.Errorf("an unknown policy's String: %q", got)
	}
}

// limits.min_interval bounds how often a series may fire: an every or a
// cron whose closest occurrences come sooner is rejected, naming it; its
// floor is MinEvery, whatever the limit says.
func TestParseRecurringMinInterval(t *testing.T) {
	pub := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	lim := testLimits
	lim.MinInterval = time.Minute
	parseAt := func(l Limits, h Headers) Decision {
		return Parse(&Incoming{Headers: h, PublishedAt: pub}, testRoute(), l, pub, nil)
	}
	for _, h := range []Headers{
		hdrs(HeaderEvery, "30s"),
		hdrs(HeaderEvery, "59999ms"),
		hdrs(HeaderCron, "*/10 * * * * *"), // every 10 s
		hdrs(HeaderCron, "0,30 * * * * *"), // 30 s apart
	} {
		mustReject(t, parseAt(lim, h), "limits.min_interval 1m0s")
	}
	for _, h := range []Headers{hdrs(HeaderEvery, "1m"), hdrs(HeaderCron, "0 0,1 9 * * *"), hdrs(HeaderCron, "@hourly")} {
		mustPark(t, parseAt(lim, h))
	}
	// Below MinEvery no limit goes: a zero or smaller limit is MinEvery.
	lim.MinInterval = time.Millisecond
	mustReject(t, parseAt(lim, hdrs(HeaderEvery, "500ms")), "limits.min_interval 1s")
	mustPark(t, parseAt(lim, hdrs(HeaderCron, "* * * * * *")))
}

// Under missed all, the missed_max most recent occurrences a series has
// are published, within its until and its count, for a cron schedule as
// for an every one: a cron series whose count or until ended while nothing
// fired published none of its missed occurrences (the most recent were
// counted back from now, then found past the end). Walked occurrence by
// occurrence through Skip and Next, as the scheduler fires them.
func TestMissedAllKeepsTheMostRecentWithinTheSeriesEnd(t *testing.T) {
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	now := start.Add(32 * time.Second) // occurrence 1 fired; down until now
	for _, c := range []struct {
		name  string
		count int
		until time.Duration
		want  []int // the occurrences published after the restart
	}{
		{"count 5", 5, 0, []int{4, 5}},
		{"until +16s", 0, 16 * time.Second, []int{3, 4}},
		{"count 12", 12, 0, []int{6, 7, 8}}, // 2-7 missed; 8 is due after now
		{"no end", 0, 0, []int{6, 7, 8}},
	} {
		for _, kind := range []string{"cron", "every"} {
			r := &Recurrence{Anchor: start, N: 1, Missed: MissedAll, MissedMax: 2, Count: c.count}
			if kind == "cron" {
				r.Cron = "*/5 * * * * *"
			} else {
				r.Every = 5 * time.Second
			}
			if c.until > 0 {
				r.Until = start.Add(c.until)
			}
			var got []int
			due, cur := start, r
			for {
				next, f, ok := cur.Following(due, now)
				if !ok || next.After(now.Add(5*time.Second)) {
					break
				}
				due, cur = next, f
				if !cur.Skip(due, now) {
					got = append(got, cur.N)
				}
				if next.After(now) {
					break // the first one on schedule again
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("%s, %s: published %v, want %v", c.name, kind, got, c.want)
			}
		}
	}
}

// A missed_max far beyond what is walked (an import line may give any)
// costs no more than maxWalk: a cron series' most recent missed
// occurrences were kept in a ring made to its size, 2,000,000,000 times.
func TestMissedAllHugeBoundCostsAWalk(t *testing.T) {
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	r := &Recurrence{Cron: "* * * * * *", Anchor: start, N: 1, Missed: MissedAll, MissedMax: 2_000_000_000}
	now := start.Add(10 * time.Second)
	next, n, ok := r.Next(start, now)
	if !ok || n != 2 || !next.Equal(start.Add(time.Second)) {
		t.Fatalf("next %v #%d %v, want every missed one from #2", next, n, ok)
	}
	if r.Skip(start.Add(time.Second), now) {
		t.Error("a missed occurrence within the bound is skipped")
	}
}
