package e2e

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// newNATSEnvMissed is newNATSEnv with the route's missed policy set to
// policy (once, all or skip).
func newNATSEnvMissed(t *testing.T, sched, policy string) *natsEnv {
	t.Helper()
	e := newNATSEnv(t, sched, "")
	e.d.stop()
	cfg, err := os.ReadFile(e.d.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg = []byte(strings.Replace(string(cfg), "allow_override: true", "allow_override: true\n      missed: "+policy, 1))
	if err := os.WriteFile(e.d.cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	e.d.start()
	return e
}

// occurrence is one published copy of a series: its number, due time and
// the time the sink's stream stored it.
type occurrence struct {
	n       int
	due, at time.Time
}

func (e *natsEnv) occurrences(id string) map[int][]occurrence {
	out := map[int][]occurrence{}
	for _, f := range e.firedCopies(id) {
		n, _ := strconv.Atoi(f.headers.Get(envelope.HeaderOccurrence))
		out[n] = append(out[n], occurrence{n: n, due: f.due, at: f.at})
	}
	return out
}

// TestMissedAfterDowntime: a series of x-delay-every 1s
// fires its first occurrence, the daemon is stopped for 3.5 s, and what
// comes after the restart follows route.missed:
//   - all: every missed occurrence is published at once, each with its own
//     due time, then the series goes on on its schedule;
//   - once: the first missed occurrence is published (late), the others are
//     passed over, and the series goes on at its first time after that;
//   - skip: no missed occurrence is published; the series goes on at its
//     first time after the restart.
//
// In every case occurrence n is due at the first one's due time + (n-1) s
// and nothing is published twice (the stop is graceful).
func TestMissedAfterDowntime(t *testing.T) {
	const downtime = 3500 * time.Millisecond
	for _, policy := range []string{"all", "once", "skip"} {
		t.Run(policy, func(t *testing.T) {
			// Servers of its own; what it checks is counted from the due
			// times and the stop and restart it measures, not a latency
			// (harness_test.go): the three policies run side by side.
			t.Parallel()
			e := newNATSEnvMissed(t, "", policy)
			e.publish("delayed.m", []byte("tick"), envelope.HeaderMessageID, "series",
				envelope.HeaderDelay, "200", envelope.HeaderEvery, "1s")
			e.waitFired(10*time.Second, "series")
			e.d.stop()
			stopped := time.Now()
			<-time.After(downtime) // the downtime is the scenario, not a wait for anything
			restarting := time.Now()
			e.d.start()

			// Wait until two occurrences due after the restart have come.
			var got map[int][]occurrence
			testenv.Eventually(t, 15*time.Second, func() bool {
				got = e.occurrences("series")
				after := 0
				for _, cs := range got {
					if cs[0].due.After(restarting) {
						after++
					}
				}
				return after >= 2
			}, "the series did not go on after the restart")
			e.d.stop() // no more occurrences while checking

			got = e.occurrences("series")
			first := got[1][0].due
			var missedPublished, passedOver []int
			maxN := 0
			for n, cs := range got {
				maxN = max(maxN, n)
				if len(cs) > 1 {
					t.Errorf("occurrence %d published %d times", n, len(cs))
				}
				c := cs[0]
				if want := first.Add(time.Duration(n-1) * time.Second); !c.due.Equal(want) {
					t.Errorf("occurrence %d due %v, want %v (no drift)", n, c.due, want)
				}
				if c.at.Before(c.due) {
					t.Errorf("occurrence %d published %v before its due time %v", n, c.at, c.due)
				}
				if n > 1 && c.due.After(stopped) && c.due.Before(restarting) {
					missedPublished = append(missedPublished, n)
				}
			}
			for n := 2; n <= maxN; n++ {
				if _, ok := got[n]; !ok {
					passedOver = append(passedOver, n)
				}
			}
			slices.Sort(missedPublished)
			t.Logf("missed: %s; occurrences 1..%d, published while down: %v, passed over: %v", policy, maxN, missedPublished, passedOver)

			switch policy {
			case "all":
				if len(passedOver) != 0 || len(missedPublished) < 3 {
					t.Errorf("all: passed over %v, published missed %v; want none passed over and at least 3 missed published", passedOver, missedPublished)
				}
			case "once":
				if len(got[2]) != 1 || !got[2][0].at.After(restarting) {
					t.Fatalf("once: occurrence 2 (the first missed) not published once after the restart: %v", got[2])
				}
				// The ones due while it waited are passed over, then the series
				// goes on at its first time after occurrence 2 fired.
				if len(passedOver) < 2 || passedOver[0] != 3 {
					t.Errorf("once: passed over %v, want 3.. (the missed after the first)", passedOver)
				}
				next := passedOver[len(passedOver)-1] + 1
				if d := got[next][0].due; d.After(got[2][0].at.Add(time.Second)) || d.Before(restarting) {
					t.Errorf("once: occurrence %d due %v, want the first time after occurrence 2 fired at %v", next, d, got[2][0].at)
				}
			case "skip":
				if len(missedPublished) != 0 || len(passedOver) < 3 || passedOver[0] != 2 {
					t.Errorf("skip: published missed %v, passed over %v; want none published and 2.. passed over", missedPublished, passedOver)
				}
			}
		})
	}
}

// TestNoDriftFromAnAnchorLongPast, under the bounds of recurring
// schedules: a series of x-delay-every 1s whose first occurrence was
// due 1,000 s before it was parked, under route.missed: all, fires that
// first occurrence, passes over the 1,000 that fell due before it was
// parked (they are never "missed"), and goes on on its anchor's grid:
// occurrence n due at exactly the anchor + (n-1) s, numbered from the
// anchor, although each fired after its due time: the next time comes
// from the schedule, never from the firing.
func TestNoDriftFromAnAnchorLongPast(t *testing.T) {
	const past = 1000
	e := newNATSEnvMissed(t, "", "all")
	anchor := time.Now().Add(-past * time.Second).Truncate(time.Millisecond)
	e.publish("delayed.d", []byte("tick"), envelope.HeaderMessageID, "series",
		envelope.HeaderDeliverAt, anchor.Format(time.RFC3339Nano), envelope.HeaderEvery, "1s")
	if !testenv.Poll(60*time.Second, func() bool { return len(e.occurrences("series")) >= 4 }) {
		_, inspect := e.d.get("/v1/messages/series", nil)
		t.Fatalf("%d occurrences published; the series: %s; dead: %+v", len(e.occurrences("series")), inspect, e.d.dead())
	}
	got := e.occurrences("series")
	if first := got[1]; len(first) != 1 || !first[0].due.Equal(anchor) {
		t.Fatalf("the first occurrence: %+v, want once, due at the anchor %v", first, anchor)
	}
	for n, cs := range got {
		if len(cs) != 1 {
			t.Fatalf("occurrence %d published %d times", n, len(cs))
		}
		if want := anchor.Add(time.Duration(n-1) * time.Second); !cs[0].due.Equal(want) {
			t.Fatalf("occurrence %d due %v, want %v (anchor + %d s)", n, cs[0].due, want, n-1)
		}
		if n > 1 && n < past {
			t.Fatalf("occurrence %d, due before the series was parked, was published", n)
		}
	}
	t.Logf("%d occurrences: 1, then from %d on the anchor's grid", len(got), past)
}
