package e2e

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// TestRecurringSurvivesKill9 sends one x-delay-every: 1s series of 12
// occurrences and kills the daemon with SIGKILL at random moments of it,
// restarting it each time: every occurrence is delivered (route.missed: all),
// occurrence n is due at the first one's due time + (n-1) s exactly (no
// drift, whatever the firings' lateness), none is published before its due
// time, nothing beyond the 12th is published, and the series is never forked:
// after the last one nothing of it stays in Redis. Duplicates may only be the
// occurrence in flight at a kill.
func TestRecurringSurvivesKill9(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	const count = 12
	// The route's missed policy is all for this test: every occurrence fires.
	e := newNATSEnvMissed(t, ", lease: 1s, publish_timeout: 500ms", "all")

	e.publish("delayed.every", []byte("tick"),
		envelope.HeaderMessageID, "series",
		envelope.HeaderEvery, "1s",
		envelope.HeaderCount, strconv.Itoa(count))
	deadline := time.Now().Add(count*time.Second + 30*time.Second)
	for kills := 0; kills < 3; kills++ {
		// A random moment within the series: a fault, timed on purpose.
		<-time.After(time.Duration(1500+rand.IntN(2500)) * time.Millisecond)
		e.d.proc.Kill()
		e.d.start()
	}
	occurrences := func() map[int]int {
		seen := map[int]int{}
		for _, f := range e.firedCopies("series") {
			n, _ := strconv.Atoi(f.headers.Get(envelope.HeaderOccurrence))
			seen[n]++
		}
		return seen
	}
	if !testenv.Poll(time.Until(deadline), func() bool { return len(occurrences()) >= count }) {
		t.Fatalf("occurrences delivered: %v, want 1..%d", occurrences(), count)
	}
	copies := e.firedCopies("series")
	var first time.Time
	dups := 0
	for n, k := range occurrences() {
		if n < 1 || n > count {
			t.Errorf("occurrence %d published (count %d)", n, count)
		}
		dups += k - 1
	}
	for _, f := range copies {
		if f.headers.Get(envelope.HeaderOccurrence) == "1" {
			first = f.due
		}
	}
	for _, f := range copies {
		n, _ := strconv.Atoi(f.headers.Get(envelope.HeaderOccurrence))
		if want := first.Add(time.Duration(n-1) * time.Second); !f.due.Equal(want) {
			t.Errorf("occurrence %d due %v, want %v (first + %d s)", n, f.due, want, n-1)
		}
		if f.at.Before(f.due) {
			t.Errorf("occurrence %d published at %v, before its due time %v", n, f.at, f.due)
		}
		if f.headers.Get(envelope.HeaderMessageID) != "series" {
			t.Errorf("occurrence %d has x-message-id %q", n, f.headers.Get(envelope.HeaderMessageID))
		}
	}
	t.Logf("%d occurrences, %d duplicate publishes (the occurrence in flight at a kill)", count, dups)
	if dups > 3 {
		t.Errorf("%d duplicates for 3 kills", dups)
	}
	// The series has ended: nothing of it is parked.
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, _ := e.d.get("/v1/messages/series", nil)
		return code == 404
	}, "the ended series still known")
}
