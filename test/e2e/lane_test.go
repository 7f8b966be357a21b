package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestDestinationsStayInTheirLane against the real binary: a publisher who
// may choose a destination, a forwarding template and a kafka-scheduler
// record each ask the NATS sink to publish to $JS.API.STREAM.DELETE.* and
// .PURGE.*, which would delete and purge streams with the daemon's own
// credentials. Each such message (and one to Kafka's _schemas or
// connect-offsets, or to a subject or topic this daemon consumes: a loop)
// is dead at ingest with destination_reserved, the streams keep their
// messages, a "*" pattern opens nothing of the control plane, a pattern
// that names $KV literally reaches the KV bucket, and an ordinary message
// behind them fires. validate warns about a route that lets publishers
// choose any destination.
func TestDestinationsStayInTheirLane(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	ns, rs := testenv.NATS(t), testenv.Redis(t)
	kc := testenv.Kafka(t, testenv.WithTopic("lane-sched", 1))
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js, _ := jetstream.New(nc)
	victims := []string{"VICTIM", "V2", "X"}
	for _, name := range victims {
		s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"victim." + strings.ToLower(name) + ".>"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, "victim."+strings.ToLower(name)+".m", []byte("keep me")); err != nil {
			t.Fatal(err)
		}
		_ = s
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	fired := make(chan *nats.Msg, 16)
	if _, err := nc.ChanSubscribe("fired.>", fired); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	cfg := fmt.Sprintf(`
redis: {addr: %q, key_prefix: lane}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms}
ingest:
  - name: override
    nats: {url: %q, subject: "lane.o.>", stream: LANE_O}
    route: {sink: nats, destination: fired.o, allow_override: true}
  - name: forward
    nats: {url: %q, subject: "lane.f.>", stream: LANE_F}
    route: {sink: nats, destination: "{source.4:}", allowed_destinations: ["fired.>", "$KV.orders.>"]}
  - name: sched
    kafka: {brokers: [%q], topic: lane-sched, group: lane, session_timeout: 2s}
    dialects: [kafka-scheduler]
    route: {sink: kafka, destination: unscheduled, allow_override: true, allowed_destinations: ["*"]}
sinks:
  - name: nats
    nats: {url: %q, jetstream: false}
  - name: kafka
    kafka: {brokers: [%q]}
`, rs.Addr, ns.URL, ns.URL, kc.Brokers[0], ns.URL, kc.Brokers[0])

	// validate: valid, with a warning naming what the override route opens.
	path := filepath.Join(t.TempDir(), "lane.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(cfg, "%ADMIN%", "127.0.0.1:1")), 0o644); err != nil {
		t.Fatal(err)
	}
	v := testenv.StartProcess(t, testenv.Build(t), "validate", "-c", path)
	if code := v.Wait(30 * time.Second); code != 0 ||
		!strings.Contains(v.Output(), "warning: ingest[0].route.allowed_destinations (override): not set, and allow_override lets a publisher choose any destination") {
		t.Fatalf("validate: exit %d\n%s", code, v.Output())
	}

	d := startDaemon(t, cfg)
	t.Cleanup(d.stop)

	pub := func(subject, id string, headers ...string) {
		m := nats.NewMsg(subject)
		m.Data = []byte(id)
		m.Header.Set("x-delay", "50")
		m.Header.Set("x-message-id", id)
		for i := 0; i+1 < len(headers); i += 2 {
			m.Header.Set(headers[i], headers[i+1])
		}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LANE_O", Subjects: []string{"lane.o.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LANE_F", Subjects: []string{"lane.f.>"}}); err != nil {
		t.Fatal(err)
	}
	pub("lane.o.x", "o-delete", "x-delay-destination", "$JS.API.STREAM.DELETE.VICTIM")
	pub("lane.o.x", "o-purge", "x-delay-destination", "$JS.API.STREAM.PURGE.V2")
	pub("lane.o.x", "o-inbox", "x-delay-destination", "_INBOX.abc")
	pub("lane.o.x", "o-loop", "x-delay-destination", "lane.f.loop")
	pub("lane.f.x.$JS.API.STREAM.DELETE.VICTIM", "f-delete")
	pub("lane.f.x.$KV.orders.k1", "f-kv")
	w := &kafka.Writer{Addr: kafka.TCP(kc.Brokers...), Topic: "lane-sched", RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	record := func(id, target string, headers ...kafka.Header) kafka.Message {
		return kafka.Message{Key: []byte(id), Value: []byte("s"), Headers: append([]kafka.Header{
			{Key: "scheduler-epoch", Value: []byte(fmt.Sprint(time.Now().Unix()))},
			{Key: "scheduler-target-topic", Value: []byte(target)},
		}, headers...)}
	}
	if err := w.WriteMessages(ctx,
		record("s-delete", "$JS.API.STREAM.DELETE.X", kafka.Header{Key: "x-delay-sink", Value: []byte("nats")}),
		record("s-schemas", "_schemas"), record("s-connect", "connect-offsets"), record("s-loop", "lane-sched"),
	); err != nil {
		t.Fatal(err)
	}
	pub("lane.o.x", "o-ok")

	select {
	case m := <-fired:
		if m.Subject != "fired.o" || string(m.Data) != "o-ok" {
			t.Fatalf("fired %s %q", m.Subject, m.Data)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the ordinary message behind the refused ones did not fire")
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		e, err := kv.Get(ctx, "k1")
		return err == nil && string(e.Value()) == "f-kv"
	}, "$KV.orders.k1, named literally by a pattern, was not written")

	want := map[string]string{"o-delete": `"$JS.API.STREAM.DELETE.VICTIM" begins with "$"`, "o-purge": `begins with "$"`,
		"o-inbox": `begins with "_INBOX."`, "f-delete": `begins with "$"`, "s-delete": `begins with "$"`,
		"o-loop": `"lane.f.loop" is in "lane.f.>", what ingest forward consumes`, "s-schemas": `"_schemas" begins with "_"`,
		"s-connect": `"connect-offsets" is in "connect-offsets"`, "s-loop": `"lane-sched" is in "lane-sched", what ingest sched consumes`}
	testenv.Eventually(t, 30*time.Second, func() bool { return len(d.dead()) >= len(want) }, "the refused messages are not all dead")
	got := map[string]string{}
	for _, m := range d.dead() {
		got[m.ID] = m.Reason
	}
	for id, reason := range want {
		if !strings.Contains(got[id], reason) {
			t.Errorf("dead %s: reason %q, want it to contain %q", id, got[id], reason)
		}
	}
	for id := range want {
		if !strings.HasPrefix(got[id], "destination_reserved: ") {
			t.Errorf("dead %s: reason %q does not begin with destination_reserved", id, got[id])
		}
	}
	if n, _ := metricValue(d.metrics(), "delaybridge_ingest_rejected_total", map[string]string{"reason": "destination_reserved"}); n != float64(len(want)) {
		t.Errorf("delaybridge_ingest_rejected_total{reason=destination_reserved} = %v, want %d", n, len(want))
	}
	for _, name := range victims {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if info, err := s.Info(ctx); err != nil || info.State.Msgs != 1 {
			t.Fatalf("stream %s: %v, %+v", name, err, info)
		}
	}
}
