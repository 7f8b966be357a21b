package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestRecurringSchedulesHaveBounds through the real binary
// (docs/reference.md: recurring schedules have bounds):
//   - a series anchored in 1970 (x-deliver-at 0) under missed: all fires its
//     first occurrence once and goes on at its next time after parking:
//     a few occurrences in a few seconds, not one for each second since;
//   - a cron series anchored in 1970 in a zone with daylight saving fires
//     once and goes on, its first step as cheap as one anchored now;
//   - limits.max_series bounds the live series: past it a new one is dead
//     with the reason, and delaybridge_recurring_series shows the count;
//   - route.recurring: false refuses recurring messages with the reason.
func TestRecurringSchedulesHaveBounds(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	ns, rs := testenv.NATS(t), testenv.Redis(t)
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	fired := map[string]int{}
	if _, err := nc.Subscribe("fired.>", func(m *nats.Msg) {
		mu.Lock()
		fired[m.Header.Get("x-message-id")]++
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: %q, key_prefix: bounds, shards: 1}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms}
limits: {max_series: 2}
ingest:
  - name: all
    nats: {url: %q, subject: "bounds.all"}
    route: {sink: out, destination: fired.all, missed: all}
  - name: none
    nats: {url: %q, subject: "bounds.none"}
    route: {sink: out, destination: fired.none, recurring: false}
sinks:
  - name: out
    nats: {url: %q, jetstream: false}
`, rs.Addr, ns.URL, ns.URL, ns.URL))
	t.Cleanup(d.stop)
	pub := func(subject, id string, kv ...string) {
		t.Helper()
		m := nats.NewMsg(subject)
		m.Header.Set("x-message-id", id)
		for i := 0; i+1 < len(kv); i += 2 {
			m.Header.Set(kv[i], kv[i+1])
		}
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	pub("bounds.all", "every-1970", "x-deliver-at", "0", "x-delay-every", "1s")
	pub("bounds.all", "cron-1970", "x-deliver-at", "0", "x-delay-cron", "* * * * * *", "x-delay-timezone", "America/New_York")
	testenv.Eventually(t, 30*time.Second, func() bool {
		v, _ := metricValue(d.metrics(), "delaybridge_recurring_series", nil)
		return v == 2
	}, "delaybridge_recurring_series did not reach 2")
	pub("bounds.all", "third", "x-delay-every", "1s")
	pub("bounds.none", "refused", "x-delay-every", "1s")
	testenv.Eventually(t, 30*time.Second, func() bool { return len(d.dead()) == 2 }, "the third series and the refused one are not dead")
	reasons := map[string]string{}
	for _, m := range d.dead() {
		reasons[m.ID] = m.Reason
	}
	if !strings.Contains(reasons["third"], "limits.max_series") {
		t.Errorf("third series: %q", reasons["third"])
	}
	if !strings.Contains(reasons["refused"], "route.recurring: false") {
		t.Errorf("refused: %q", reasons["refused"])
	}
	// Let the two series run three seconds: about one occurrence a second.
	testenv.Eventually(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return fired["every-1970"] >= 3 && fired["cron-1970"] >= 3
	}, "the series anchored in 1970 did not go on after their first occurrence")
	mu.Lock()
	defer mu.Unlock()
	elapsed := time.Since(start)
	for id, n := range fired {
		if limit := int(elapsed/time.Second) + 2; n > limit {
			t.Errorf("%s fired %d times in %v: missed occurrences from before it was parked were published", id, n, elapsed.Round(time.Millisecond))
		}
	}
	t.Logf("in %v: %v fired (before: 6,877 in 3 s)", elapsed.Round(time.Millisecond), fired)
}
