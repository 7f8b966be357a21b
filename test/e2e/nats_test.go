package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// natsEnv is Redis + NATS with an ingest stream DELAYED (delayed.>) and a
// sink stream FIRED (fired.>), and a daemon between them.
type natsEnv struct {
	t     *testing.T
	nats  *testenv.NATSServer
	redis *testenv.RedisServer
	js    jetstream.JetStream
	d     *daemon

	mu      sync.Mutex
	fired   map[string][]firedMsg // by x-message-id
	lastSeq uint64                // the FIRED stream sequence read last
}

type firedMsg struct {
	subject string
	headers nats.Header
	body    []byte
	at      time.Time // sink stream timestamp: when the sink received it
	due     time.Time
}

const natsConfig = `
redis: {addr: "%s", key_prefix: e2e}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms, backoff: {initial: 100ms, max: 1s}%s}
shutdown_timeout: 20s
ingest:
  - name: in
    nats: {url: "%s", subject: "delayed.>", stream: DELAYED, durable: delaybridge}
    route:
      sink: out
      destination: fired.default
      allow_override: true
      allowed_destinations: ["fired.*"]
sinks:
  - name: out
    nats: {url: "%s", jetstream: true}
`

// newNATSEnv starts the servers and a daemon; sched is appended to the
// scheduler settings (", lease: 2s"), extraConfig to the file.
func newNATSEnv(t *testing.T, sched, extraConfig string, env ...string) *natsEnv {
	t.Helper()
	return newNATSEnvEdit(t, func(_ *natsEnv, cfg string) string { return cfg + extraConfig }, sched, env...)
}

// newNATSEnvEdit is newNATSEnv with the daemon's configuration as edit
// makes it from the environment's.
func newNATSEnvEdit(t *testing.T, edit func(e *natsEnv, cfg string) string, sched string, env ...string) *natsEnv {
	t.Helper()
	e := &natsEnv{t: t, nats: testenv.NATS(t), redis: testenv.Redis(t), fired: map[string][]firedMsg{}}
	nc, err := nats.Connect(e.nats.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	e.js, err = jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, subj := range map[string]string{"DELAYED": "delayed.>", "FIRED": "fired.>"} {
		if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}}); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := e.js.OrderedConsumer(ctx, "FIRED", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		md, _ := m.Metadata()
		f := firedMsg{subject: m.Subject(), headers: m.Headers(), body: m.Data(), at: md.Timestamp}
		f.due, _ = time.Parse(time.RFC3339Nano, m.Headers().Get(envelope.HeaderDueAt))
		e.mu.Lock()
		id := m.Headers().Get(envelope.HeaderMessageID)
		e.fired[id] = append(e.fired[id], f)
		e.lastSeq = max(e.lastSeq, md.Sequence.Stream)
		e.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	e.d = startDaemon(t, edit(e, e.config(sched)), env...)
	return e
}

// config is the daemon configuration of this environment.
func (e *natsEnv) config(sched string) string {
	return fmt.Sprintf(natsConfig, e.redis.Addr, sched, e.nats.URL, e.nats.URL)
}

// publish sends one message to the ingest stream.
func (e *natsEnv) publish(subject string, body []byte, headers ...string) {
	e.t.Helper()
	m := nats.NewMsg(subject)
	m.Data = body
	for i := 0; i+1 < len(headers); i += 2 {
		m.Header.Add(headers[i], headers[i+1])
	}
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		e.t.Fatal(err)
	}
}

func (e *natsEnv) firedCopies(id string) []firedMsg {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]firedMsg(nil), e.fired[id]...)
}

// caughtUp waits until the consumer has read everything the sink stream
// FIRED holds now, so that what fired is all there to check.
func (e *natsEnv) caughtUp() {
	e.t.Helper()
	st, err := e.js.Stream(context.Background(), "FIRED")
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	testenv.Eventually(e.t, 10*time.Second, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.lastSeq >= info.State.LastSeq
	}, "the consumer of FIRED reading up to sequence %d", info.State.LastSeq)
}

func (e *natsEnv) waitFired(timeout time.Duration, ids ...string) {
	e.t.Helper()
	testenv.Eventually(e.t, timeout, func() bool {
		for _, id := range ids {
			if len(e.firedCopies(id)) == 0 {
				return false
			}
		}
		return true
	}, "not every message fired")
}

// TestNATSEndToEnd sends 1,000 messages with random delays of 0-2 s and
// checks every one arrives once, none before its due time, with the body
// byte for byte and the headers the contract promises.
func TestNATSEndToEnd(t *testing.T) {
	e := newNATSEnv(t, "", "")
	const n = 1000
	type sent struct {
		body  []byte
		delay time.Duration
	}
	all := map[string]sent{}
	ids := make([]string, 0, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("m-%04d", i)
		body := make([]byte, 1+rand.IntN(300))
		for j := range body {
			body[j] = byte(rand.IntN(256)) // binary bodies must pass unchanged
		}
		delay := time.Duration(rand.IntN(2001)) * time.Millisecond
		all[id] = sent{body, delay}
		ids = append(ids, id)
		e.publish("delayed.orders", body,
			"x-delay", strconv.FormatInt(delay.Milliseconds(), 10),
			"X-Message-Id", id,
			"x-custom", "v-"+id,
			"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	}
	t.Logf("published %d in %v", n, time.Since(start))
	e.waitFired(30*time.Second, ids...)

	var late latency
	for _, id := range ids {
		copies := e.firedCopies(id)
		if len(copies) != 1 {
			t.Errorf("%s arrived %d times", id, len(copies))
		}
		f := copies[0]
		s := all[id]
		if !bytes.Equal(f.body, s.body) {
			t.Errorf("%s: body changed", id)
		}
		if f.subject != "fired.default" {
			t.Errorf("%s: subject %q", id, f.subject)
		}
		h := f.headers
		for k, want := range map[string]string{
			"x-custom": "v-" + id, "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			envelope.HeaderMessageID: id, envelope.HeaderNatsMsgID: id, envelope.HeaderAttempt: "1",
		} {
			if got := h.Get(k); got != want {
				t.Errorf("%s: header %s = %q, want %q", id, k, got, want)
			}
		}
		if h.Get("x-delay") != "" {
			t.Errorf("%s: control header x-delay was forwarded", id)
		}
		if f.due.IsZero() {
			t.Fatalf("%s: no %s header", id, envelope.HeaderDueAt)
		}
		if f.at.Before(f.due) {
			t.Errorf("%s: published %v before its due time %v", id, f.at, f.due)
		}
		late = append(late, f.at.Sub(f.due))
	}
	t.Logf("fire lateness (sink stream time - due time): %s", late.summary())
	testenv.Eventually(t, 10*time.Second, func() bool { return e.d.stats().Parked == 0 }, "messages left parked after delivery")

	// The metrics tell the same story.
	fams := e.d.metrics()
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"delaybridge_ingest_messages_total", map[string]string{"ingest": "in", "result": "parked"}, n},
		{"delaybridge_sink_published_total", map[string]string{"sink": "out"}, n},
		{"delaybridge_fire_lateness_seconds", map[string]string{"sink": "out"}, n},
		{"delaybridge_parked_messages", nil, 0},
		{"delaybridge_due_messages", nil, 0},
		{"delaybridge_connection_up", map[string]string{"kind": "redis"}, 1},
		{"delaybridge_connection_up", map[string]string{"kind": "ingest", "name": "in"}, 1},
		{"delaybridge_connection_up", map[string]string{"kind": "sink", "name": "out"}, 1},
	} {
		got, ok := metricValue(fams, c.name, c.labels)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	for _, name := range []string{"delaybridge_claim_batch_size", "delaybridge_park_batch_size",
		"delaybridge_redis_script_duration_seconds", "delaybridge_sink_publish_duration_seconds", "delaybridge_oldest_due_age_seconds"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("metric %s missing", name)
		}
	}
}

// TestNATSCancel cancels parked messages by a control message and through
// the admin API; they never fire, the others do.
func TestNATSCancel(t *testing.T) {
	e := newNATSEnv(t, "", "")
	for i := 0; i < 6; i++ {
		e.publish("delayed.c", []byte("c"), "x-delay", "2s", "x-message-id", fmt.Sprintf("c%d", i))
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return e.d.stats().Parked == 6 }, "not parked")
	// By control message (not parked itself)...
	e.publish("delayed.c", nil, "x-delay-cancel", "c0")
	e.publish("delayed.c", nil, "X-Delay-Cancel", "c1")
	// ...and by the admin API.
	if code, body := e.d.do(http.MethodDelete, "/v1/messages/c2", nil); code != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	if code, _ := e.d.do(http.MethodDelete, "/v1/messages/c2", nil); code != http.StatusNotFound {
		t.Fatalf("second DELETE: %d, want 404", code)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return e.d.stats().Parked == 3 }, "cancels not applied")
	// A sentinel due after the cancelled ones: once it fired, they would have too.
	e.publish("delayed.c", []byte("s"), "x-delay", "2500ms", "x-message-id", "sentinel")
	e.waitFired(15*time.Second, "c3", "c4", "c5", "sentinel")
	for _, id := range []string{"c0", "c1", "c2"} {
		if n := len(e.firedCopies(id)); n != 0 {
			t.Errorf("cancelled %s fired %d times", id, n)
		}
	}
	// A cancel of an unknown ID is kept as dead with its reason.
	e.publish("delayed.c", nil, "x-delay-cancel", "never-parked", "x-message-id", "cancel-unknown")
	testenv.Eventually(t, 10*time.Second, func() bool {
		for _, d := range e.d.dead() {
			if d.ID == "cancel-unknown" && strings.Contains(d.Reason, "never-parked") {
				return true
			}
		}
		return false
	}, "cancel of an unknown ID not kept as dead")
}

// TestNATSBadInput sends each invalid form between two valid messages: every
// invalid one is dead with a reason and counted, the daemon keeps running, and
// every valid one is delivered.
func TestNATSBadInput(t *testing.T) {
	e := newNATSEnv(t, "", "limits: {max_payload_bytes: 1000, max_id_bytes: 256}\n")
	bad := []struct {
		name    string
		headers []string
		body    []byte
		noID    bool // the case is about the ID: it is kept under a fallback ID
		reason  string
	}{
		{name: "empty delay", headers: []string{"x-delay", ""}, reason: "x-delay is empty"},
		{name: "unparsable delay", headers: []string{"x-delay", "soon"}, reason: "neither milliseconds"},
		{name: "NaN delay", headers: []string{"x-delay", "NaN"}, reason: "neither milliseconds"},
		{name: "infinite delay", headers: []string{"x-delay", "+Inf"}, reason: "neither milliseconds"},
		{name: "exponent delay", headers: []string{"x-delay", "1e3"}, reason: "neither milliseconds"},
		{name: "negative delay", headers: []string{"x-delay", "-5000"}, reason: "negative"},
		{name: "negative duration", headers: []string{"x-delay", "-5s"}, reason: "negative"},
		{name: "overflowing delay", headers: []string{"x-delay", "99999999999999999999999"}, reason: "out of range"},
		{name: "overflowing duration", headers: []string{"x-delay", "99999999999h"}, reason: "out of range"},
		{name: "both headers", headers: []string{"x-delay", "1s", "x-deliver-at", "2030-01-01T00:00:00Z"}, reason: "both x-delay and x-deliver-at"},
		{name: "bad deliver-at", headers: []string{"x-deliver-at", "tomorrow"}, reason: "neither RFC 3339"},
		{name: "deliver-at before 1970", headers: []string{"x-deliver-at", "-1"}, reason: "before 1970"},
		{name: "no delay and no default", headers: []string{"x-other", "1"}, reason: "no x-delay or x-deliver-at"},
		{name: "beyond max_delay", headers: []string{"x-delay", "9000h"}, reason: "max_delay"},
		{name: "deliver-at beyond max_delay", headers: []string{"x-deliver-at", "2999-01-01T00:00:00Z"}, reason: "max_delay"},
		{name: "body over the limit", headers: []string{"x-delay", "1"}, body: make([]byte, 2000), reason: "max_payload_bytes"},
		{name: "disallowed destination", headers: []string{"x-delay", "1", "x-delay-destination", "elsewhere"}, reason: "allowed_destinations"},
		{name: "empty destination", headers: []string{"x-delay", "1", "x-delay-destination", " "}, reason: "x-delay-destination is empty"},
		{name: "unknown sink", headers: []string{"x-delay", "1", "x-delay-sink", "nope"}, reason: "names no configured sink"},
		{name: "bad priority", headers: []string{"x-delay", "1", "x-delay-priority", "high"}, reason: "x-delay-priority"},
		{name: "non-UTF-8 delay", headers: []string{"x-delay", "\xff\xfe"}, reason: "x-delay"},
		{name: "binary delay", headers: []string{"x-delay", "\x00\x01\x02"}, reason: "x-delay"},
		{name: "delay given twice", headers: []string{"x-delay", "1", "x-delay", "2"}, reason: "given 2 times"},
		{name: "cancel of an unknown ID", headers: []string{"x-delay-cancel", "never-parked"}, reason: "never-parked"},
		{name: "10 kB ID", headers: []string{"x-delay", "1", "x-message-id", strings.Repeat("i", 10_000)}, noID: true, reason: "max_id_bytes"},
		{name: "non-UTF-8 ID", headers: []string{"x-delay", "1", "x-message-id", "id\xff"}, noID: true, reason: "not valid UTF-8"},
		{name: "ID with a bidi override", headers: []string{"x-delay", "1", "x-message-id", "invoice-\u202egpj.exe"}, noID: true, reason: "U+202E"},
		{name: "ID with a C1 control", headers: []string{"x-delay", "1", "x-message-id", "id\u0085x"}, noID: true, reason: "U+0085"},
		{name: "cancel of an ID with an isolate", headers: []string{"x-delay-cancel", "\u2066x\u2069"}, reason: "U+2066"},
	}
	var valid []string
	for i, b := range bad {
		before, after := fmt.Sprintf("ok-%d-a", i), fmt.Sprintf("ok-%d-b", i)
		valid = append(valid, before, after)
		e.publish("delayed.b", []byte("ok"), "x-delay", "10", "x-message-id", before)
		h := b.headers
		if !b.noID {
			h = append(h, "x-message-id", "bad-"+strconv.Itoa(i))
		}
		body := b.body
		if body == nil {
			body = []byte("bad")
		}
		e.publish("delayed.b", body, h...)
		e.publish("delayed.b", []byte("ok"), "x-delay", "10", "x-message-id", after)
	}
	// Valid edge cases: an empty body, and the same ID twice (the second is
	// a no-op: the first body is delivered, once).
	e.publish("delayed.b", nil, "x-delay", "10", "x-message-id", "empty-body")
	e.publish("delayed.b", []byte("first"), "x-delay", "300", "x-message-id", "twice")
	e.publish("delayed.b", []byte("second"), "x-delay", "10", "x-message-id", "twice")
	valid = append(valid, "empty-body", "twice")

	e.waitFired(30*time.Second, valid...)
	var dead []deadMessage
	testenv.Eventually(t, 10*time.Second, func() bool { dead = e.d.dead(); return len(dead) >= len(bad) }, "dead messages missing")
	byID := map[string]string{}
	for _, d := range dead {
		byID[d.ID] = d.Reason
	}
	for i, b := range bad {
		if b.noID {
			found := false
			for _, d := range dead {
				found = found || strings.Contains(d.Reason, b.reason)
			}
			if !found {
				t.Errorf("%s: no dead message with a reason mentioning %q", b.name, b.reason)
			}
			continue
		}
		id := "bad-" + strconv.Itoa(i)
		reason, ok := byID[id]
		if !ok {
			t.Errorf("%s (%s): not kept as dead", b.name, id)
			continue
		}
		if !strings.Contains(reason, b.reason) {
			t.Errorf("%s: reason %q does not mention %q", b.name, reason, b.reason)
		}
		if n := len(e.firedCopies(id)); n != 0 {
			t.Errorf("%s: invalid message was delivered", b.name)
		}
	}
	if c := e.firedCopies("empty-body"); len(c[0].body) != 0 {
		t.Errorf("empty body arrived as %q", c[0].body)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return e.d.stats().Parked == 0 })
	e.caughtUp()
	if c := e.firedCopies("twice"); len(c) != 1 || string(c[0].body) != "first" {
		t.Errorf("same ID twice: %d copies, first body %q", len(c), c[0].body)
	}
	rejected, _ := metricValue(e.d.metrics(), "delaybridge_ingest_rejected_total", nil)
	if int(rejected) != len(bad) {
		t.Errorf("delaybridge_ingest_rejected_total = %v, want %d", rejected, len(bad))
	}
	if code, _ := e.d.get("/healthz", nil); code != 200 {
		t.Fatalf("daemon unhealthy after bad input: %d", code)
	}
}

// TestNATSRestartKeepsParkedMessages stops the daemon (SIGTERM) with
// messages parked, starts it again, and expects every message delivered.
func TestNATSRestartKeepsParkedMessages(t *testing.T) {
	e := newNATSEnv(t, "", "")
	var ids []string
	for i := 0; i < 200; i++ {
		id := fmt.Sprintf("r-%03d", i)
		ids = append(ids, id)
		e.publish("delayed.r", []byte(id), "x-delay", strconv.Itoa(1500+rand.IntN(1500)), "x-message-id", id)
	}
	// All parked (or, on a machine slow enough to take 1.5 s, parked and
	// fired already) before the stop.
	testenv.Eventually(t, 10*time.Second, func() bool {
		e.mu.Lock()
		n := int64(len(e.fired))
		e.mu.Unlock()
		return e.d.stats().Parked+n >= 200
	}, "not all parked")
	e.d.stop()
	e.d.start()
	e.waitFired(30*time.Second, ids...)
	for _, id := range ids {
		c := e.firedCopies(id)
		if string(c[0].body) != id {
			t.Errorf("%s: body %q", id, c[0].body)
		}
	}
}
