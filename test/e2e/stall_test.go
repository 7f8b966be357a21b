package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestOneDestinationNeverAnswers with the real binary and a real NATS: 32
// messages to a subject whose stream sends no PubAcks (NoAck: the JetStream
// publish waits for a PubAck that never comes) among
// 40 messages to a subject with a stream, due one after the other. The 40
// must arrive once each, none waiting for the publish timeout (the sink is
// not taken for down, and no confirmed PubAck is lost to the timeout of
// another message of the batch), and the 32 count their attempts and end
// dead with the reason.
func TestOneDestinationNeverAnswers(t *testing.T) {
	ns, rs := testenv.NATS(t), testenv.Redis(t)
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js, _ := jetstream.New(nc)
	for name, subj := range map[string]string{"STALL_IN": "stall.in.>", "STALL_OK": "fired.ok.>", "STALL_STUCK": "fired.stuck.>"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}, NoAck: name == "STALL_STUCK"}); err != nil {
			t.Fatal(err)
		}
	}
	// Core subscribers see every publish (JetStream would drop a duplicate
	// by its Nats-Msg-Id); the one on fired.stuck never answers either.
	var mu sync.Mutex
	got := map[string][]time.Duration{} // ID -> lateness of each arrival
	if _, err := nc.Subscribe("fired.ok.>", func(m *nats.Msg) {
		due, err := time.Parse(time.RFC3339Nano, m.Header.Get("x-delaybridge-due-at"))
		if err != nil {
			t.Errorf("due-at %q: %v", m.Header.Get("x-delaybridge-due-at"), err)
		}
		mu.Lock()
		got[m.Header.Get("x-message-id")] = append(got[m.Header.Get("x-message-id")], time.Now().Round(0).Sub(due))
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Subscribe("fired.stuck.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const timeout = 2 * time.Second
	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: %q, key_prefix: stall}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms, publish_timeout: %s, max_attempts: 1, backoff: {initial: 100ms, max: 200ms}}
ingest:
  - name: in
    nats: {url: %q, subject: "stall.in.>", stream: STALL_IN}
    route: {sink: js, destination: "fired.{source.3}.x"}
sinks:
  - name: js
    nats: {url: %q, jetstream: true}
`, rs.Addr, timeout, ns.URL, ns.URL))
	t.Cleanup(d.stop)

	var kinds []string
	for i := 0; i < 32; i++ {
		kinds = append(kinds, "stuck")
	}
	for i := 0; i < 40; i++ {
		kinds = append(kinds, "ok")
	}
	rand.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	// Due one after the other, 50 ms apart, the two kinds mixed.
	first := time.Now().Add(time.Second)
	for i, kind := range kinds {
		m := nats.NewMsg("stall.in." + kind)
		m.Header.Set("x-deliver-at", first.Add(time.Duration(i)*50*time.Millisecond).UTC().Format(time.RFC3339Nano))
		m.Header.Set("x-message-id", fmt.Sprintf("%s-%d", kind, i))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 40
	}, "the 40 messages to the answering destination did not all arrive")
	testenv.Eventually(t, time.Minute, func() bool { return len(d.dead()) == 32 }, "the 32 messages to the silent destination did not end dead")
	for _, m := range d.dead() {
		if !strings.HasPrefix(m.ID, "stuck-") || !strings.Contains(m.Reason, "did not answer") {
			t.Errorf("dead %s: %q", m.ID, m.Reason)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var late latency
	dups := 0
	for id, arrivals := range got {
		dups += len(arrivals) - 1
		late = append(late, arrivals[0])
		if arrivals[0] >= timeout {
			t.Errorf("%s arrived %v after its due time: it waited for the silent destination's timeout (%v)", id, arrivals[0], timeout)
		}
	}
	t.Logf("40 messages to the answering destination beside 32 to a silent one: lateness %s, %d published twice", late.summary(), dups)
	if dups > 0 {
		t.Errorf("%d messages to the answering destination were published twice", dups)
	}
}
