package natsbroker

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// A publish to a subject the sink's user may not publish to is refused by
// the server in a -ERR alone: a core NATS publish returned as sent (the
// message counted delivered and lost), and a JetStream one waited the whole
// publish timeout and counted a timeout. Both now fail as unauthorized, an
// attempt of the message, as soon as the server said so, and the other
// messages of the batch go on.
func TestSinkPublishTheServerRefusesIsUnauthorized(t *testing.T) {
	url := startServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir(),
		Users: []*server.User{{Username: "db", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"deny.>"}}}}}})
	admin, err := nats.Connect(url, nats.UserInfo("db", "pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	for name, subj := range map[string]string{"DENIED": "deny.>", "OK": "ok.>"} {
		if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: []string{subj}}); err != nil {
			t.Fatal(err)
		}
	}
	out := func(id, dest string) sinks.Outgoing {
		return sinks.Outgoing{Attempt: 1, Message: &envelope.Message{ID: id, Destination: dest, Body: []byte("x")}}
	}
	for _, jetStream := range []bool{true, false} {
		name := map[bool]string{true: "jetstream", false: "core"}[jetStream]
		t.Run(name, func(t *testing.T) {
			sk, err := NewSink(SinkParams{Name: name, URL: url, JetStream: jetStream,
				Options: []nats.Option{nats.UserInfo("db", "pw")}}, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sk.Close() })
			const timeout = 20 * time.Second
			for round := range 2 { // the second finds the first's refusal behind it
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				start := time.Now()
				errs := sk.Publish(ctx, []sinks.Outgoing{out("a", "deny.a"), out("b", "ok.b"), out("c", "deny.c")})
				took := time.Since(start)
				cancel()
				for _, i := range []int{0, 2} {
					if err := errs[i]; !sinks.IsRejected(err) || sinks.ReasonOf(err) != sinks.ReasonUnauthorized || !strings.Contains(err.Error(), "not authorized") {
						t.Errorf("round %d: a message to a subject the user may not publish to: %v (rejected %v, reason %q); want rejected as unauthorized",
							round, err, sinks.IsRejected(err), sinks.ReasonOf(err))
					}
				}
				if errs[1] != nil {
					t.Errorf("round %d: the message to a subject it may publish to: %v", round, errs[1])
				}
				if took >= timeout {
					t.Errorf("round %d: the refusal waited the publish timeout", round)
				}
			}
		})
	}
}

// A destination that never answers (a core NATS subscriber on a subject no
// stream stores), at volume, leaves the sink's other destinations their
// room: each of its publishes holds one of the PubAcks nats.go waits for,
// and past maxPending nats.go held every publish of the sink, a healthy
// stream's too (a probe: 14,674 of 30,000 healthy messages dead). Once half
// are held, the silent subject is not sent to: its messages fail as timed
// out, unsent, and the healthy one is published.
func TestSinkASilentDestinationLeavesTheOthersRoom(t *testing.T) {
	ns := testenv.NATS(t)
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if _, err := nc.Subscribe("silent.>", func(*nats.Msg) {}); err != nil { // takes each publish, answers none
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "OK", Subjects: []string{"ok.>"}}); err != nil {
		t.Fatal(err)
	}
	sk, err := NewSink(SinkParams{Name: "silent", URL: ns.URL, JetStream: true}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sk.Close() })
	out := func(id, dest string) sinks.Outgoing {
		return sinks.Outgoing{Attempt: 1, Message: &envelope.Message{ID: id, Destination: dest, Body: []byte("x")}}
	}
	const batch = 1000
	refused := 0
	for round := range maxPending/batch + 2 { // past what nats.go holds
		msgs := make([]sinks.Outgoing, batch)
		for i := range msgs {
			msgs[i] = out(fmt.Sprintf("s-%d-%d", round, i), "silent.x")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		for _, err := range sk.Publish(ctx, msgs) {
			if err == nil {
				t.Fatal("a publish to a silent subject confirmed")
			}
			if sinks.ReasonOf(err) != sinks.ReasonTimeout {
				t.Fatalf("a publish to a silent subject: %v, want a timeout", err)
			}
			if strings.Contains(err.Error(), "still without a PubAck") {
				refused++
			}
		}
		cancel()
	}
	if refused == 0 {
		t.Fatal("every publish to the silent subject was sent")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if errs := sk.Publish(ctx, []sinks.Outgoing{out("healthy", "ok.a")}); errs[0] != nil {
		t.Fatalf("a publish to a healthy stream after %d to the silent subject: %v", (maxPending/batch+2)*batch, errs[0])
	}
}
