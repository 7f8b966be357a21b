package scheduler

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// logBuffer is what a logger writes while the test reads it, by line.
type logBuffer struct{ testenv.Output }

// lines returns the lines that contain every one of subs.
func (l *logBuffer) lines(subs ...string) []string {
	var out []string
next:
	for _, line := range strings.Split(l.String(), "\n") {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// A flood of failed publishes to one destination is one WARN line per
// log.repeat_interval, with the broker's reason; the failures it kept quiet
// are counted in a line once the interval ended, and every failure is
// counted in delaybridge_sink_publish_errors_total{sink,reason}. A message
// that goes dead in the flood is likewise one line. The interval is on the
// injected clock.
func TestFailedPublishesAreLoggedOncePerDestinationPerInterval(t *testing.T) {
	const n = 300
	var logs logBuffer
	unroutable := sinks.Rejected(sinks.Because(sinks.ReasonUnroutable, errors.New(`exchange "" has no queue bound for routing key "dest" (returned 312 NO_ROUTE)`)))
	h := start(t, Params{MaxAttempts: 1, RepeatInterval: 10 * time.Second, MaxSleep: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, func(h *harness) {
		h.sink.fail = func(sinks.Outgoing) error { return unroutable }
		for i := range n {
			h.store.park(fmt.Sprintf("m%d", i), h.clock.Now(), "s")
		}
	})
	for range n {
		recv(t, h.store.dead, "dead")
	}
	if got := testutil.ToFloat64(h.sched.p.Metrics.PublishErrors.WithLabelValues("s", "unroutable")); got != n {
		t.Errorf("delaybridge_sink_publish_errors_total{sink=s,reason=unroutable} = %v, want %d", got, n)
	}
	failed := logs.lines("level=WARN", `msg="publish failed"`)
	if len(failed) != 1 || !strings.Contains(failed[0], "sink=s") || !strings.Contains(failed[0], "destination=dest") ||
		!strings.Contains(failed[0], "reason=unroutable") || !strings.Contains(failed[0], "NO_ROUTE") {
		t.Fatalf("want one WARN with the sink, the destination, the reason and the broker's words for %d failed publishes; the log:\n%s", n, logs.String())
	}
	if dead := logs.lines("level=WARN", `msg="message is dead"`); len(dead) != 1 {
		t.Fatalf("%d WARN lines for %d dead messages to one destination, want 1; the log:\n%s", len(dead), n, logs.String())
	}

	h.clock.Advance(10 * time.Second) // the interval ends: the count of the others is said
	testenv.Eventually(t, 5*time.Second, func() bool {
		return len(logs.lines("level=WARN", `msg="publish failed (repeats)"`, "destination=dest", fmt.Sprintf("not_logged=%d", n-1))) == 1 &&
			len(logs.lines("level=WARN", `msg="message is dead (repeats)"`, fmt.Sprintf("not_logged=%d", n-1))) == 1
	}, "no line with the %d failures not logged after the interval; the log:\n%s", n-1, &logs)
}

// Failed publishes to many destinations of one sink (a subject per
// message: an entity's ID in it) are at most perSinkLines lines of each
// kind per interval, the others counted in a line of the sink once the
// interval ended: each destination's first line was a line per message
// (2,000 a second in a probe while a stream was down).
func TestFailuresToManyDestinationsAreLoggedPerSink(t *testing.T) {
	const n = 200
	var logs logBuffer
	unroutable := sinks.Rejected(sinks.Because(sinks.ReasonUnroutable, errors.New("returned 312 NO_ROUTE")))
	h := start(t, Params{MaxAttempts: 1, RepeatInterval: 10 * time.Second, MaxSleep: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, func(h *harness) {
		h.sink.fail = func(sinks.Outgoing) error { return unroutable }
		for i := range n {
			id := fmt.Sprintf("m%d", i)
			h.store.park(id, h.clock.Now(), "s")
			h.store.msgs[id].Destination = "orders." + id
		}
	})
	for range n {
		recv(t, h.store.dead, "dead")
	}
	if got := len(logs.lines("level=WARN", `msg="publish failed"`)); got != perSinkLines {
		t.Errorf("%d WARN lines for %d failed publishes to %d destinations of one sink, want %d", got, n, n, perSinkLines)
	}
	if got := len(logs.lines("level=WARN", `msg="message is dead"`)); got != perSinkLines {
		t.Errorf("%d WARN lines for %d dead messages, want %d", got, n, perSinkLines)
	}
	h.clock.Advance(10 * time.Second)
	testenv.Eventually(t, 5*time.Second, func() bool {
		return len(logs.lines("level=WARN", `msg="publish failed (more destinations)"`, "sink=s", fmt.Sprintf("not_logged=%d", n-perSinkLines))) == 1 &&
			len(logs.lines("level=WARN", `msg="message is dead (more destinations)"`, fmt.Sprintf("not_logged=%d", n-perSinkLines))) == 1
	}, "no line of the sink with the %d not logged after the interval; the log:\n%s", n-perSinkLines, &logs)
}

// A claim Redis refuses is logged once per log.repeat_interval with the
// others counted, not once per shard and attempt: every shard meets the
// same outage, and a layout this build does not know made 183 lines in
// 20 s.
func TestRedisFailuresAreLoggedOncePerInterval(t *testing.T) {
	var logs testenv.Output
	h := start(t, Params{RepeatInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, func(h *harness) {
		h.store.claimErr = errors.New("store: redis holds a layout this build does not know")
	})
	failed := func() int {
		h.store.mu.Lock()
		defer h.store.mu.Unlock()
		return h.store.claimsFailed
	}
	for k := 1; k <= 5; k++ {
		testenv.Eventually(t, 10*time.Second, func() bool { return failed() >= k }, "claim %d", k)
		h.clock.Advance(time.Minute) // the retry's back-off
	}
	if n := strings.Count(logs.String(), "layout this build does not know"); n != 1 {
		t.Fatalf("%d lines for %d failed claims within the interval, want 1 saying why:\n%s", n, failed(), logs.String())
	}
}
