package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestParkedLimitPausesIngest: with limits.max_parked_messages reached,
// nothing more is parked or acknowledged, /readyz says why, and POST
// /v1/messages answers 503 with Retry-After; but cancels still go through
// (a header behind the waiting messages, of a parked one and of a waiting
// one; DELETE) and free room; parking resumes as messages fire, until
// everything else is delivered.
func TestParkedLimitPausesIngest(t *testing.T) {
	e := newNATSEnv(t, "", "limits: {max_parked_messages: 40}\n")
	var ids []string
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			id := fmt.Sprintf("l-%03d", i)
			ids = append(ids, id)
			e.publish("delayed.l", []byte(id), "x-delay", "6000", "x-message-id", id)
		}
	}
	publish(0, 40)
	testenv.Eventually(t, 10*time.Second, func() bool { return e.d.stats().Parked == 40 }, "first 40 not parked")
	publish(40, 120)
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, body := e.d.get("/readyz", nil)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "max_parked_messages")
	}, "readyz does not report the limit")
	if p := e.d.stats().Parked; p != 40 {
		t.Fatalf("parked %d with a limit of 40", p)
	}
	code, body := e.d.send(http.MethodPost, "/v1/messages", `{"delay":"1s","sink":"out","destination":"fired.l","body":"api"}`, nil)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "max_parked_messages") {
		t.Fatalf("POST at the limit: %d %s", code, body)
	}
	// Cancels behind the 80 waiting messages: of a parked one and of a
	// waiting one, by header, and of a parked one by DELETE.
	e.publish("delayed.l", nil, "x-delay-cancel", "l-000", "x-message-id", "cancel-0")
	e.publish("delayed.l", nil, "x-delay-cancel", "l-100", "x-message-id", "cancel-100")
	testenv.Eventually(t, 5*time.Second, func() bool {
		n, _ := metricValue(e.d.metrics(), "delaybridge_ingest_messages_total", map[string]string{"result": "cancelled"})
		return n == 2
	}, "the cancels behind the waiting messages were not honoured")
	if code, body := e.d.do(http.MethodDelete, "/v1/messages/l-001", nil); code != http.StatusNoContent {
		t.Fatalf("DELETE at the limit: %d %s", code, body)
	}
	cancelled := map[string]bool{"l-000": true, "l-001": true, "l-100": true}
	var rest []string
	for _, id := range ids {
		if !cancelled[id] {
			rest = append(rest, id)
		}
	}
	e.waitFired(60*time.Second, rest...)
	testenv.Eventually(t, 10*time.Second, func() bool { return e.d.stats().Parked == 0 }, "messages still parked")
	e.caughtUp()
	for id := range cancelled {
		if n := len(e.firedCopies(id)); n != 0 {
			t.Errorf("%s was cancelled and fired %d times", id, n)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool { code, _ := e.d.get("/readyz", nil); return code == 200 }, "not ready after the backlog drained")
}

// TestIngestMaxParkedPausesOnlyItsIngest: an ingest at its max_parked
// parks nothing more (its gauges say so; a cancel behind its waiting
// messages still goes through) while another ingest parks and fires on;
// as its messages leave (cancelled here), the rest are parked and fire.
func TestIngestMaxParkedPausesOnlyItsIngest(t *testing.T) {
	e := newNATSEnvEdit(t, func(e *natsEnv, cfg string) string {
		cfg = strings.Replace(cfg, `subject: "delayed.>", stream: DELAYED, durable: delaybridge}`,
			`subject: "delayed.noisy.>", stream: DELAYED, durable: delaybridge}
    max_parked: 5`, 1)
		return strings.Replace(cfg, "sinks:\n", `  - name: calm
    nats: {url: "`+e.nats.URL+`", subject: "delayed.calm.>", stream: DELAYED, durable: calm}
    route: {sink: out, destination: fired.calm}
sinks:
`, 1)
	}, "")
	var noisy, calm []string
	publish := func(from, to int, delay string) {
		for i := from; i < to; i++ {
			id := fmt.Sprintf("noisy-%02d", i)
			noisy = append(noisy, id)
			e.publish("delayed.noisy.x", []byte(id), "x-delay", delay, "x-message-id", id)
		}
	}
	// The bound holds back what comes once it is reached (a batch read
	// before may pass it: one per instance). The first 5 are due in an
	// hour: room comes when they are cancelled.
	publish(0, 5, "3600000")
	testenv.Eventually(t, 10*time.Second, func() bool { return e.d.stats().Parked == 5 }, "the first 5 not parked")
	publish(5, 12, "2000")
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("calm-%02d", i)
		calm = append(calm, id)
		e.publish("delayed.calm.x", []byte(id), "x-delay", "4000", "x-message-id", id)
	}
	gauge := func(name, ingest string) float64 {
		v, _ := metricValue(e.d.metrics(), name, map[string]string{"ingest": ingest})
		return v
	}
	held := func() bool {
		paused, _ := metricValue(e.d.metrics(), "delaybridge_ingest_paused", map[string]string{"ingest": "in", "reason": "max_parked"})
		return gauge("delaybridge_ingest_parked_messages", "in") == 5 && gauge("delaybridge_ingest_parked_messages", "calm") == 20 &&
			gauge("delaybridge_ingest_paused", "in") == 1 && paused == 1
	}
	if !testenv.Poll(20*time.Second, held) {
		t.Fatalf("the noisy ingest was not held at its max_parked of 5 while the calm one parked its 20: parked %v and %v, paused %v",
			gauge("delaybridge_ingest_parked_messages", "in"), gauge("delaybridge_ingest_parked_messages", "calm"), gauge("delaybridge_ingest_paused", "in"))
	}
	if v := gauge("delaybridge_ingest_paused", "calm"); v != 0 {
		t.Errorf("the calm ingest paused (%v) by the noisy one's bound", v)
	}
	if v := gauge("delaybridge_ingest_max_parked", "in"); v != 5 {
		t.Errorf("delaybridge_ingest_max_parked = %v, want 5", v)
	}
	e.publish("delayed.noisy.x", nil, "x-delay-cancel", "noisy-11", "x-message-id", "cancel-11")
	testenv.Eventually(t, 5*time.Second, func() bool {
		n, _ := metricValue(e.d.metrics(), "delaybridge_ingest_messages_total", map[string]string{"ingest": "in", "result": "cancelled"})
		return n == 1
	}, "the cancel behind the noisy ingest's waiting messages was not honoured")
	e.waitFired(30*time.Second, calm...)
	for _, id := range noisy[:5] { // room for the noisy ingest's waiting messages
		if code, body := e.d.do(http.MethodDelete, "/v1/messages/"+id, nil); code != http.StatusNoContent {
			t.Fatalf("DELETE %s: %d %s", id, code, body)
		}
	}
	e.waitFired(30*time.Second, noisy[5:11]...)
	for _, id := range append(noisy[:5], noisy[11]) {
		if n := len(e.firedCopies(id)); n != 0 {
			t.Errorf("%s was cancelled and fired %d times", id, n)
		}
	}
}

// limits.max_dead bounds the dead messages an ingest keeps: its oldest
// beyond it are deleted, its newest stay.
func TestMaxDeadKeepsAnIngestsNewest(t *testing.T) {
	e := newNATSEnv(t, "", "limits: {max_dead: 3}\n")
	for i := range 10 {
		if i == 7 {
			// The ingest parks (and rejects) a batch by several workers,
			// in no set order: the last three are sent once the first
			// seven are dead, so that they die after them.
			testenv.Eventually(t, 20*time.Second, func() bool {
				v, _ := metricValue(e.d.metrics(), "delaybridge_ingest_messages_total", map[string]string{"ingest": "in", "result": "rejected"})
				return v == 7
			}, "the first seven not rejected")
		}
		id := fmt.Sprintf("bad-%02d", i)
		// a destination the route does not allow: dead at ingest
		e.publish("delayed.x", []byte(id), "x-delay", "100", "x-message-id", id, "x-delay-destination", "elsewhere.x")
	}
	var ids []string
	if !testenv.Poll(20*time.Second, func() bool {
		ids = ids[:0]
		for _, m := range e.d.dead() {
			ids = append(ids, m.ID)
		}
		slices.Sort(ids)
		return e.d.stats().Dead <= 3 && slices.Equal(ids, []string{"bad-07", "bad-08", "bad-09"})
	}) {
		t.Fatalf("dead messages %v (stats: %d), want the newest 3 of the 10", ids, e.d.stats().Dead)
	}
}

// TestIngestMaxParkedHoldsOnABurst: a burst far larger than an ingest's
// max_parked parks exactly the bound (one instance): what a batch brings
// past it waits, however the pipeline's parks and the measures of the
// counts interleave; the rest is parked as room comes, and the store's
// limit leaves room for another ingest.
func TestIngestMaxParkedHoldsOnABurst(t *testing.T) {
	e := newNATSEnvEdit(t, func(e *natsEnv, cfg string) string {
		return strings.Replace(cfg, `subject: "delayed.>", stream: DELAYED, durable: delaybridge}`,
			`subject: "delayed.>", stream: DELAYED, durable: delaybridge}
    max_parked: 100`, 1)
	}, "")
	for i := range 600 {
		m := nats.NewMsg("delayed.burst")
		m.Data = []byte("b")
		m.Header.Set("x-message-id", fmt.Sprintf("burst-%03d", i))
		m.Header.Set("x-delay", "3600000")
		if _, err := e.js.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("the burst was not stored in 30 s")
	}
	paused := func() bool {
		v, _ := metricValue(e.d.metrics(), "delaybridge_ingest_paused", map[string]string{"ingest": "in", "reason": "max_parked"})
		return v == 1
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return paused() && e.d.stats().Parked >= 100 }, "the ingest paused at its bound")
	if n := e.d.stats().Parked; n != 100 {
		t.Fatalf("%d messages of a burst of 600 parked, with max_parked 100", n)
	}
	// Room as messages leave: the next ones are parked, to the bound again.
	// Which 100 were parked first is not the burst's order (its batches
	// are parked side by side): the ones cancelled are read from the API.
	var listed struct {
		Messages []struct{ ID string } `json:"messages"`
	}
	if code, body := e.d.get("/v1/messages?limit=30", &listed); code != http.StatusOK || len(listed.Messages) != 30 {
		t.Fatalf("list: %d %s", code, body)
	}
	for _, m := range listed.Messages {
		if code, body := e.d.do(http.MethodDelete, "/v1/messages/"+m.ID, nil); code != http.StatusNoContent {
			t.Fatalf("DELETE %s: %d %s", m.ID, code, body)
		}
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		n, _ := metricValue(e.d.metrics(), "delaybridge_ingest_messages_total", map[string]string{"ingest": "in", "result": "parked"})
		return n == 130
	}, "30 more parked once 30 were cancelled")
	if n := e.d.stats().Parked; n != 100 {
		t.Fatalf("%d messages parked after 30 cancelled and more parked, with max_parked 100", n)
	}
}

// TestTooLargeForItsSinkRefusedAtOnce: a body within
// limits.max_payload_bytes (1 MiB by default) that the NATS sink's server
// cannot take with its headers (its max_payload is 1 MiB too) is refused
// as the POST comes, naming the server's limit, not parked to die at its
// due time; one a little smaller is parked.
func TestTooLargeForItsSinkRefusedAtOnce(t *testing.T) {
	e := newNATSEnv(t, "", "")
	post := func(n int) (int, string) {
		body := fmt.Sprintf(`{"id":"big-%d","delay":"1h","sink":"out","destination":"fired.big","body":%q}`, n, strings.Repeat("x", n))
		return e.d.send(http.MethodPost, "/v1/messages", body, nil)
	}
	code, body := post(1 << 20)
	if code != http.StatusBadRequest || !strings.Contains(body, `"field":"body"`) || !strings.Contains(body, "does not fit the server's max_payload 1048576") {
		t.Fatalf("POST of a 1 MiB body to a NATS sink whose server takes 1 MiB in all: %d %s, want 400 for the body naming max_payload", code, body)
	}
	if code, body := post(1<<20 - 4096); code/100 != 2 {
		t.Fatalf("POST of a body 4 KiB under the server's max_payload: %d %s", code, body)
	}
	if s := e.d.stats(); s.Parked != 1 {
		t.Fatalf("parked %d, want only the one that fits", s.Parked)
	}
}

// TestWaitingMessagesAreNotDeliveredAgain: while an ingest's messages wait
// for the store's room, JetStream is told every third of the consumer's
// ack_wait that they are in progress, so it does not deliver them again:
// each redelivery was read and dropped as a re-read, again and again for
// as long as the store stayed full. Once there is room they are parked and
// fire once.
func TestWaitingMessagesAreNotDeliveredAgain(t *testing.T) {
	// Told every third of it, a message has two thirds of it to spare for
	// a late turn of a loaded machine.
	const ackWait = 2 * time.Second
	e := newNATSEnvEdit(t, func(e *natsEnv, cfg string) string {
		return strings.Replace(cfg, `durable: delaybridge}`, `durable: delaybridge, ack_wait: `+ackWait.String()+`}`, 1) + "limits: {max_parked_messages: 5}\n"
	}, "")
	var ids []string
	publish := func(from, to int, delay string) {
		for i := from; i < to; i++ {
			id := fmt.Sprintf("w-%02d", i)
			ids = append(ids, id)
			e.publish("delayed.w", []byte(id), "x-delay", delay, "x-message-id", id)
		}
	}
	// The first 5 fill the store until they are cancelled: parked before
	// the others come, as batches read side by side take the room in
	// either order.
	publish(0, 5, "3600000")
	testenv.Eventually(t, 10*time.Second, func() bool { return e.d.stats().Parked == 5 }, "the first 5 not parked")
	publish(5, 15, "500")
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, body := e.d.get("/readyz", nil)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "wait for the store to have room")
	}, "the messages past the limit do not wait")
	cons, err := e.js.Consumer(context.Background(), "DELAYED", "delaybridge")
	if err != nil {
		t.Fatal(err)
	}
	pending := func() int {
		info, err := cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return info.NumAckPending
	}
	// The acks of the 5 parked may still be on their way.
	testenv.Eventually(t, 10*time.Second, func() bool { return pending() == 10 }, "the 5 parked messages are not acknowledged")
	// Three ack_waits: each waiting message would have come back at least
	// twice.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(3 * ackWait); time.Now().Before(deadline); <-tick.C {
		info, err := cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumRedelivered != 0 || info.NumAckPending != 10 {
			t.Fatalf("while 10 messages wait for room: %d redelivered, %d pending an ack; want 0 and 10", info.NumRedelivered, info.NumAckPending)
		}
	}
	for _, id := range ids[:5] {
		if code, body := e.d.do(http.MethodDelete, "/v1/messages/"+id, nil); code != http.StatusNoContent {
			t.Fatalf("DELETE %s: %d %s", id, code, body)
		}
	}
	e.waitFired(30*time.Second, ids[5:]...)
	e.caughtUp()
	for _, id := range ids[5:] {
		if n := len(e.firedCopies(id)); n != 1 {
			t.Errorf("%s fired %d times, want once", id, n)
		}
	}
	if n, _ := metricValue(e.d.metrics(), "delaybridge_ingest_messages_total", map[string]string{"result": "duplicate"}); n != 0 {
		t.Errorf("%v re-reads of the waiting messages, want 0", n)
	}
}

// TestEvictionPolicySetWhileRunning: an allkeys-* maxmemory-policy set by
// CONFIG SET while the daemon runs (Redis may then delete parked messages)
// makes /readyz answer 503 naming it, within the time it is read again;
// set back, the daemon is ready again.
func TestEvictionPolicySetWhileRunning(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	e := newNATSEnv(t, "", "")
	rdb := e.redis.Client()
	ctx := context.Background()
	set := func(policy string) {
		if err := rdb.ConfigSet(ctx, "maxmemory-policy", policy).Err(); err != nil {
			t.Fatal(err)
		}
	}
	set("allkeys-lru")
	defer set("noeviction")
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, body := e.d.get("/readyz", nil)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "maxmemory-policy allkeys-lru")
	}, "/readyz does not name the eviction policy set while running")
	set("noeviction")
	testenv.Eventually(t, 30*time.Second, func() bool { code, _ := e.d.get("/readyz", nil); return code == http.StatusOK }, "not ready again")
}
