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

// scheduleSide is one way to delay NATS messages: nats-server's own message
// schedules (ADR-51), or delaybridge. Both have their own server, so that
// the publisher uses the same subjects on both and only the header names
// differ (docs/migrate-nats-schedules.md).
type scheduleSide struct {
	name string
	t    *testing.T
	js   jetstream.JetStream
	// headers turns a schedule (subject, due time, target) into the
	// side's headers.
	headers func(subject string, due time.Time, target string) nats.Header
	d       *daemon // delaybridge only

	mu  sync.Mutex
	got []seen
}

// seen is a message as a consumer of orders.> saw it.
type seen struct {
	subject string
	body    string
	headers nats.Header
	at      time.Time // when the consumer got it
}

func (s *scheduleSide) publish(subject, body string, due time.Time, target string, extra ...string) {
	s.t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(body)
	m.Header = s.headers(subject, due, target)
	for i := 0; i+1 < len(extra); i += 2 {
		m.Header.Set(extra[i], extra[i+1])
	}
	if _, err := s.js.PublishMsg(context.Background(), m); err != nil {
		s.t.Fatalf("%s: publish %s: %v", s.name, subject, err)
	}
}

func (s *scheduleSide) seen() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.got...)
}

// consume records what a consumer of the stream's orders.> subjects gets.
func (s *scheduleSide) consume(stream string) {
	s.t.Helper()
	cons, err := s.js.OrderedConsumer(context.Background(), stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"orders.>"}})
	if err != nil {
		s.t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		at := time.Now().Round(0)
		s.mu.Lock()
		s.got = append(s.got, seen{subject: m.Subject(), body: string(m.Data()), headers: m.Headers(), at: at})
		s.mu.Unlock()
	})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(cc.Stop)
}

// jetStreamOf is a JetStream context of the test's own on ns.
func jetStreamOf(t *testing.T, ns *testenv.NATSServer) jetstream.JetStream {
	t.Helper()
	_, js := ns.Client(t)
	return js
}

// newScheduleSides starts both sides: a stream SCHED (sched.>, orders.>)
// that allows message schedules; and delaybridge reading sched.> into
// Redis and publishing to a stream OUT (orders.>).
func newScheduleSides(t *testing.T) (native, bridge *scheduleSide) {
	ctx := context.Background()
	native = &scheduleSide{name: "NATS schedules", t: t, js: jetStreamOf(t, testenv.NATS(t)),
		headers: func(_ string, due time.Time, target string) nats.Header {
			return nats.Header{
				jetstream.ScheduleHeader:       {"@at " + due.UTC().Format(time.RFC3339Nano)},
				jetstream.ScheduleTargetHeader: {target},
			}
		}}
	if _, err := native.js.CreateStream(ctx, jetstream.StreamConfig{Name: "SCHED", Subjects: []string{"sched.>", "orders.>"}, AllowMsgSchedules: true}); err != nil {
		t.Fatal(err)
	}
	native.consume("SCHED")

	// The mapping of docs/migrate-nats-schedules.md: Nats-Schedule: @at T
	// -> x-deliver-at: T; Nats-Schedule-Target -> x-delay-destination; one
	// schedule per subject -> x-message-id: <subject> with
	// x-delay-replace: true.
	ns := testenv.NATS(t)
	bridge = &scheduleSide{name: "delaybridge", t: t, js: jetStreamOf(t, ns),
		headers: func(subject string, due time.Time, target string) nats.Header {
			return nats.Header{
				"x-deliver-at":        {due.UTC().Format(time.RFC3339Nano)},
				"x-delay-destination": {target},
				"x-message-id":        {subject},
				"x-delay-replace":     {"true"},
			}
		}}
	if _, err := bridge.js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	bridge.consume("OUT")
	rs := testenv.Redis(t)
	bridge.d = startDaemon(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: natsmig}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms}
ingest:
  - name: schedules
    nats: {url: "%s", subject: "sched.>", stream: SCHED_IN}
    route: {sink: out, destination: orders.unscheduled, allow_override: true, allowed_destinations: ["orders.*"]}
sinks:
  - name: out
    nats: {url: "%s", jetstream: true}
`, rs.Addr, ns.URL, ns.URL))
	t.Cleanup(bridge.d.stop)
	return native, bridge
}

// TestMigrateNATSSchedules runs one workload of one-shot schedules through
// nats-server's own message schedules and through delaybridge with the
// mapped headers, and compares what a consumer sees:
// subjects, bodies, count and order must be the same; the lateness of each
// side is reported side by side (not asserted beyond sanity: the machine is
// shared).
func TestMigrateNATSSchedules(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	native, bridge := newScheduleSides(t)
	sides := []*scheduleSide{native, bridge}

	// 12 schedules, 500 ms apart (nats-server re-arms its timer no sooner
	// than 250 ms, so closer ones could fire together, in any order), to
	// three target subjects, due times with milliseconds.
	const n = 12
	base := time.Now().Add(2 * time.Second).Truncate(time.Millisecond).Add(137 * time.Millisecond)
	type schedule struct {
		subject, target, body string
		due                   time.Time
	}
	var work []schedule
	for i := range n {
		work = append(work, schedule{
			subject: fmt.Sprintf("sched.order-%02d", i),
			target:  fmt.Sprintf("orders.%d", i%3),
			body:    fmt.Sprintf("order %02d", i),
			due:     base.Add(time.Duration(i) * 500 * time.Millisecond),
		})
	}
	for _, s := range work {
		for _, side := range sides {
			side.publish(s.subject, s.body, s.due, s.target, "X-Custom", s.body)
		}
	}
	for _, side := range sides {
		testenv.Eventually(t, 30*time.Second, func() bool { return len(side.seen()) >= n }, "%s: not every schedule fired", side.name)
	}

	var want []string
	for _, s := range work {
		want = append(want, s.target+" "+s.body)
	}
	lateness := map[string]latency{}
	var table []string
	for _, side := range sides {
		got := side.seen()
		var view []string
		for i, m := range got {
			view = append(view, m.subject+" "+m.body)
			if m.headers.Get("X-Custom") != m.body {
				t.Errorf("%s: %s lost its X-Custom header: %v", side.name, m.body, m.headers)
			}
			if i < n {
				late := m.at.Sub(work[i].due)
				if late < 0 || late > 10*time.Second {
					t.Errorf("%s: %s arrived %v after its due time: beyond any sanity bound", side.name, m.body, late)
				}
				lateness[side.name] = append(lateness[side.name], late)
			}
		}
		if !slices.Equal(view, want) {
			t.Errorf("%s: a consumer of orders.> saw\n%s\nwant (due order)\n%s", side.name, strings.Join(view, "\n"), strings.Join(want, "\n"))
		}
		t.Logf("%s: headers a consumer sees: %v", side.name, headerNames(got[0].headers))
	}
	for i, s := range work {
		table = append(table, fmt.Sprintf("  %-16s %-9s due %s  late: NATS %-12v delaybridge %v", s.subject, s.target,
			s.due.Format("15:04:05.000"), at(lateness[native.name], i), at(lateness[bridge.name], i)))
	}
	t.Logf("lateness of %d one-shot schedules (consumer receive time - due time):\n%s\n  NATS schedules: %s\n  delaybridge:    %s",
		n, strings.Join(table, "\n"), lateness[native.name].summary(), lateness[bridge.name].summary())
}

// TestMigrateNATSSchedulesReplaceAndCancel: a second schedule on the same
// subject replaces the first on NATS; x-message-id (the subject) with
// x-delay-replace: true does the same on delaybridge. A schedule is
// cancelled on NATS by purging its subject, on delaybridge with
// x-delay-cancel. A sentinel due after all of them proves what did not fire.
// The replace step needs the store side of replace.
func TestMigrateNATSSchedulesReplaceAndCancel(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	native, bridge := newScheduleSides(t)
	base := time.Now().Add(2 * time.Second).Truncate(time.Millisecond)
	for _, side := range []*scheduleSide{native, bridge} {
		side.publish("sched.replaced", "first version", base.Add(2*time.Second), "orders.r")
		side.publish("sched.cancelled", "cancelled", base.Add(time.Second), "orders.c")
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, _ := bridge.d.get("/v1/messages/sched.replaced", nil)
		code2, _ := bridge.d.get("/v1/messages/sched.cancelled", nil)
		return code == 200 && code2 == 200
	}, "delaybridge did not park the schedules")
	for _, side := range []*scheduleSide{native, bridge} {
		side.publish("sched.replaced", "second version", base.Add(500*time.Millisecond), "orders.r")
		side.publish("sched.sentinel", "sentinel", base.Add(3*time.Second), "orders.s")
	}
	st, err := native.js.Stream(context.Background(), "SCHED")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(context.Background(), jetstream.WithPurgeSubject("sched.cancelled")); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("sched.control")
	m.Header.Set("x-delay-cancel", "sched.cancelled")
	if _, err := bridge.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}

	for _, side := range []*scheduleSide{native, bridge} {
		testenv.Eventually(t, 30*time.Second, func() bool {
			return slices.ContainsFunc(side.seen(), func(m seen) bool { return m.body == "sentinel" })
		}, "%s: the sentinel never fired", side.name)
		var view []string
		for _, m := range side.seen() {
			view = append(view, m.subject+" "+m.body)
		}
		if want := []string{"orders.r second version", "orders.s sentinel"}; !slices.Equal(view, want) {
			t.Errorf("%s: a consumer saw %q, want %q", side.name, view, want)
		}
	}
}

func headerNames(h nats.Header) []string {
	var names []string
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

func at(l latency, i int) any {
	if i < len(l) {
		return l[i].Round(time.Millisecond)
	}
	return "-"
}
