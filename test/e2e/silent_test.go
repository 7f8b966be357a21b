package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// silentRig is the daemon with one JetStream sink beside a destination that
// never answers: the stream of fired.silent.x sends no PubAcks (NoAck), and
// its subscriber, the rig's, never answers either, so a publish there waits
// for a PubAck that never comes; the subscriber counts each publish (each time the daemon handed the message
// to the broker). fired.ok.x has a stream; the rig's subscriber there takes
// the lateness of each arrival against its due time.
type silentRig struct {
	t   *testing.T
	d   *daemon
	js  jetstream.JetStream
	ctx context.Context

	mu     sync.Mutex
	silent []time.Time                // each publish to fired.silent.x, as received
	late   map[string][]time.Duration // ID -> lateness of each arrival on fired.ok.x
}

// startSilentRig starts NATS, Redis and the daemon with scheduler settings
// sched (YAML flow mapping fields).
func startSilentRig(t *testing.T, sched string) *silentRig {
	ns, rs := testenv.NATS(t), testenv.Redis(t)
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for name, subj := range map[string]string{"SILENT_IN": "silent.in.>", "SILENT_OK": "fired.ok.>", "SILENT": "fired.silent.>"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}, NoAck: name == "SILENT"}); err != nil {
			t.Fatal(err)
		}
	}
	r := &silentRig{t: t, js: js, ctx: ctx, late: map[string][]time.Duration{}}
	if _, err := nc.Subscribe("fired.ok.>", func(m *nats.Msg) {
		now := time.Now().Round(0)
		due, err := time.Parse(time.RFC3339Nano, m.Header.Get("x-delaybridge-due-at"))
		if err != nil {
			t.Errorf("due-at %q: %v", m.Header.Get("x-delaybridge-due-at"), err)
		}
		r.mu.Lock()
		r.late[m.Header.Get("x-message-id")] = append(r.late[m.Header.Get("x-message-id")], now.Sub(due))
		r.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Subscribe("fired.silent.>", func(*nats.Msg) {
		r.mu.Lock()
		r.silent = append(r.silent, time.Now())
		r.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	r.d = startDaemon(t, fmt.Sprintf(`
redis: {addr: %q, key_prefix: silent}
admin: {listen: "%%ADMIN%%"}
scheduler: {%s}
ingest:
  - name: in
    nats: {url: %q, subject: "silent.in.>", stream: SILENT_IN}
    route: {sink: js, destination: "fired.{source.3}.x", allowed_destinations: ["fired.*.x"]}
sinks:
  - name: js
    nats: {url: %q, jetstream: true}
`, rs.Addr, sched, ns.URL, ns.URL))
	t.Cleanup(r.d.stop)
	return r
}

// send parks a message to fired.<kind>.x due at at.
func (r *silentRig) send(kind, id string, at time.Time) {
	m := nats.NewMsg("silent.in." + kind)
	m.Header.Set("x-deliver-at", at.UTC().Format(time.RFC3339Nano))
	m.Header.Set("x-message-id", id)
	if _, err := r.js.PublishMsg(r.ctx, m); err != nil {
		r.t.Fatal(err)
	}
}

// trickle parks n messages to fired.ok.x due 200 ms apart (5 msg/s) from
// first on.
func (r *silentRig) trickle(n int, first time.Time) {
	for i := range n {
		r.send("ok", fmt.Sprintf("ok-%d", i), first.Add(time.Duration(i)*200*time.Millisecond))
	}
}

// silentPublishes waits until the silent destination saw n publishes and
// returns when the n-th came.
func (r *silentRig) silentPublishes(n int, within time.Duration) time.Time {
	r.t.Helper()
	var at time.Time
	testenv.Eventually(r.t, within, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.silent) >= n {
			at = r.silent[n-1]
			return true
		}
		return false
	}, "the silent destination was not published %d times", n)
	return at
}

// trickleArrived waits for the n trickle messages and checks that each
// arrived once, every one within bound of its due time (p99, which for
// n <= 100 is the latest).
func (r *silentRig) trickleArrived(n int, bound time.Duration) {
	r.t.Helper()
	testenv.Eventually(r.t, 30*time.Second, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.late) == n
	}, "the %d messages to the answering destination did not all arrive", n)
	r.mu.Lock()
	defer r.mu.Unlock()
	var late latency
	dups := 0
	for id, arrivals := range r.late {
		dups += len(arrivals) - 1
		late = append(late, arrivals[0])
		if arrivals[0] >= bound {
			r.t.Logf("%s arrived %v after its due time", id, arrivals[0])
		}
	}
	r.t.Logf("%d messages at 5 msg/s beside the silent destination: lateness %s, %d published twice; the silent one published %d times so far",
		n, late.summary(), dups, len(r.silent))
	if p99 := late.quantile(.99); p99 >= bound {
		r.t.Errorf("lateness p99 %v, want under %v: the messages to the answering destination waited behind the silent one", p99, bound)
	}
	if dups > 0 {
		r.t.Errorf("%d messages to the answering destination were published twice", dups)
	}
}

// TestSilentDestinationAtLowTraffic checks the lateness beside a
// destination that never answers, at low traffic: a message to a
// destination that never answers is, for its first three publishes, the
// only thing due, and then a trickle of 5 msg/s comes due beside it, right
// when the silent publish times out for the third time. With nothing of
// the sink confirmed within two publish timeouts, the sink is asked
// whether its broker answers (a JetStream API request); it does, so the
// timeout is the destination's own and the sink is not blocked for a
// back-off that doubles (0.5, 1, 2 s...): the trickle is on time (p99 a
// few ms), not held (p99 about 2 s). publish_timeout is 3 s: the default,
// 10 s, stretches the same cycle to 45 s.
func TestSilentDestinationAtLowTraffic(t *testing.T) {
	// Servers of its own; its bound, 1 s for a lateness of about 1 ms, is
	// beyond what the other tests' load adds.
	t.Parallel()
	const timeout = 3 * time.Second
	r := startSilentRig(t, "publish_timeout: 3s, max_attempts: 3")
	r.send("silent", "silent", time.Now())
	third := r.silentPublishes(3, 30*time.Second)
	// Due from just after the third publish times out, 5 msg/s for 5 s.
	r.trickle(25, third.Add(timeout+100*time.Millisecond))
	r.trickleArrived(25, time.Second)
}

// TestSilentDestinationCountsFromTheThirdTimeout checks the count (the
// contract's "a destination's faults are its own": at most two timeouts in
// a row go uncounted): publish_timeout 1 s, max_attempts 3, the silent
// message alone at first, then a trickle of 5 msg/s beside it. Its first
// timeouts, with nothing else of the sink confirmed yet, must not be taken
// for the sink being down (held without counting, and with nothing else to
// publish, published for ever): it is published max_attempts + 2 = 5
// times, then dead with the reason.
func TestSilentDestinationCountsFromTheThirdTimeout(t *testing.T) {
	t.Parallel() // servers of its own; the same bound
	const maxAttempts = 3
	r := startSilentRig(t, fmt.Sprintf("publish_timeout: 1s, max_attempts: %d", maxAttempts))
	r.send("silent", "silent", time.Now())
	r.silentPublishes(2, 20*time.Second)
	r.trickle(75, time.Now().Add(200*time.Millisecond)) // 15 s: past its end
	testenv.Eventually(t, 30*time.Second, func() bool { return len(r.d.dead()) > 0 }, "the silent message did not end dead")
	r.mu.Lock()
	n := len(r.silent)
	r.mu.Unlock()
	dead := r.d.dead()
	t.Logf("the silent message was published %d times (max_attempts %d), then dead: %q", n, maxAttempts, dead[0].Reason)
	if n > maxAttempts+2 {
		t.Errorf("the silent message was published %d times, want at most max_attempts + 2 = %d", n, maxAttempts+2)
	}
	if len(dead) != 1 || dead[0].ID != "silent" || !strings.Contains(dead[0].Reason, `"fired.silent.x"`) || !strings.Contains(dead[0].Reason, "did not answer") {
		t.Errorf("dead %+v, want only the silent message, for its destination's timeouts", dead)
	}
	r.trickleArrived(75, time.Second)
}

// quantile is the p-quantile of the samples, as summary takes it.
func (l latency) quantile(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}
