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
	_, js := testenv.ConnectNATS(t, url, nats.UserInfo("db", "pw"))
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

// Refusals dropped to keep to maxDenied subjects make a core NATS publish
// count as refused (taken for done it would be lost), but never stop a
// JetStream publish from waiting for its PubAck: one refused has none.
func TestSinkRefusalsDroppedDoNotFailAJetStreamPublish(t *testing.T) {
	ns := testenv.NATS(t)
	_, js := ns.Client(t)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "OK", Subjects: []string{"ok.>"}}); err != nil {
		t.Fatal(err)
	}
	msg := []sinks.Outgoing{{Attempt: 1, Message: &envelope.Message{ID: "m", Destination: "ok.a", Body: []byte("x")}}}
	for _, jetStream := range []bool{true, false} {
		sk, err := NewSink(SinkParams{Name: "dropped", URL: ns.URL, JetStream: jetStream}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sk.Close() })
		sk.denied.mu.Lock()
		sk.denied.lostUpTo = 1 << 62 // as if refusals had been dropped since any mark
		sk.denied.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = sk.Publish(ctx, msg)[0]
		cancel()
		switch {
		case jetStream && err != nil:
			t.Errorf("JetStream with refusals dropped: %v, want the PubAck taken", err)
		case !jetStream && !sinks.IsRejected(err):
			t.Errorf("core NATS with refusals dropped: %v, want refused, not taken for done", err)
		}
	}
}

// A user who may not ask which stream stores a subject
// ($JS.API.STREAM.NAMES refused), nor perhaps whether JetStream answers
// ($JS.API.INFO), cannot tell a stream without its leader from none: a
// publish no stream answers stays the message's fault, counted
// (not_found), as before the lookup, and is not taken for its stream
// down, which would publish a misrouted message again for good (with
// $JS.API.INFO refused too it was, once another stream took a publish).
func TestSinkMayNotLookUpStreamsNoStreamCounts(t *testing.T) {
	for _, deny := range [][]string{{streamNamesAPI}, {streamNamesAPI, accountInfoAPI}} {
		t.Run(strings.Join(deny, ","), func(t *testing.T) {
			sk := deniedSink(t, deny, jetstream.StreamConfig{Name: "OK", Subjects: []string{"ok.>"}})
			out := func(id, dest string) sinks.Outgoing {
				return sinks.Outgoing{Attempt: 1, Message: &envelope.Message{ID: id, Destination: dest, Body: []byte("x")}}
			}
			for round := range 2 { // the second with the lookups off
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				errs := sk.Publish(ctx, []sinks.Outgoing{out("b", "ok.b"), out("a", "nostream.a")})
				cancel()
				if errs[0] != nil {
					t.Fatalf("round %d: the message to a stream: %v", round, errs[0])
				}
				if err := errs[1]; !sinks.IsRejected(err) || sinks.IsDown(err) || sinks.ReasonOf(err) != sinks.ReasonNotFound {
					t.Errorf("round %d: a message no stream stores, the lookup refused: %v (rejected %v, down %v); want counted as not found",
						round, err, sinks.IsRejected(err), sinks.IsDown(err))
				}
			}
			if _, st := sk.storedBy("nostream.a"); st != lookUnknown {
				t.Errorf("storedBy with the lookup refused: %v, want unknown", st)
			}
			// The probe's question refused is the server answering.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if err := sk.Probe(ctx); err != nil {
				t.Errorf("probe: %v; want the server's refusal taken for an answer", err)
			}
		})
	}
}

// The subjects of one stream (an entity's ID in each) need one lookup:
// the stream found is kept with its subjects, where more new subjects
// than lookupRate a second were left unknown, and so counted as "no
// stream" while the stream was down.
func TestStoredByKeepsAStreamsSubjects(t *testing.T) {
	ns := testenv.NATS(t)
	_, js := testenv.ConnectNATS(t, ns.URL)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.*.expired"}}); err != nil {
		t.Fatal(err)
	}
	sk, err := NewSink(SinkParams{Name: "s", URL: ns.URL, JetStream: true}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sk.Close() })
	for i := range 3 * lookupBurst {
		subject := fmt.Sprintf("orders.%d.expired", i)
		if stream, st := sk.storedBy(subject); st != lookFound || stream != "ORDERS" {
			t.Fatalf("subject %d, %s: %q, %v; want ORDERS found", i, subject, stream, st)
		}
	}
	if stream, st := sk.storedBy("orders.7.paid"); st != lookNone {
		t.Errorf("a subject no stream stores: %q, %v; want none", stream, st)
	}
}

// A server that is not a leaderless stream's peer does not answer its
// configuration: its subjects come one lookup at a time, at most
// lookupRate a second, and a subject over the rate while the stream was
// found down lately is taken for one of its (it was unknown, counted as
// "no stream", and died with its stream down). Here the configuration is
// refused ($JS.API.STREAM.INFO denied).
func TestStoredByWithoutTheStreamsSubjects(t *testing.T) {
	sk := deniedSink(t, []string{jetstream.DefaultAPIPrefix + "STREAM.INFO.>"}, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.*.expired"}})
	likely := 0
	for i := range 3 * lookupBurst {
		subject := fmt.Sprintf("orders.%d.expired", i)
		stream, st := sk.storedBy(subject)
		if stream != "ORDERS" || (st != lookFound && st != lookLikely) {
			t.Fatalf("subject %d, %s: %q, %v; want ORDERS, found or likely", i, subject, stream, st)
		}
		if st == lookLikely {
			likely++
		}
	}
	if likely == 0 {
		t.Errorf("no subject over the lookups' rate: the test tests nothing")
	}
}

// deniedSink starts a JetStream server whose user may publish to anything
// but deny, with the stream cfg, and a JetStream sink of that user (closed
// at the end of the test).
func deniedSink(t *testing.T, deny []string, cfg jetstream.StreamConfig) *Sink {
	t.Helper()
	url := startServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir(),
		Users: []*server.User{{Username: "db", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: deny}}}}})
	_, js := testenv.ConnectNATS(t, url, nats.UserInfo("db", "pw"))
	if _, err := js.CreateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	sk, err := NewSink(SinkParams{Name: "s", URL: url, JetStream: true, Options: []nats.Option{nats.UserInfo("db", "pw")}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sk.Close() })
	return sk
}
