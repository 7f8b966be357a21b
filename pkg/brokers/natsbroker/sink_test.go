package natsbroker_test

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/sinktest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/natsbroker"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// The default max_payload of nats-server is 1 MiB, headers included.
const (
	maxBody      = 1<<20 - 4096
	oversizeBody = 1<<20 + 1
)

// consumer connects the test's consumer, reconnecting quickly after a
// broker restart.
func consumer(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name("sinktest consumer"),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect consumer: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func openSink(url string, js bool) func(t *testing.T) sinks.Sink {
	return func(t *testing.T) sinks.Sink {
		t.Helper()
		s, err := natsbroker.NewSink(natsbroker.SinkParams{Name: "conformance", URL: url, JetStream: js}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("natsbroker.New: %v", err)
		}
		return s
	}
}

// received converts a NATS message as a consumer sees it; the broker's ID
// header Nats-Msg-Id becomes BrokerID.
func received(h nats.Header, data []byte) sinktest.Received {
	r := sinktest.Received{Body: append([]byte(nil), data...)}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if strings.EqualFold(k, envelope.HeaderNatsMsgID) {
			r.BrokerID = h[k][0]
			continue
		}
		for _, v := range h[k] {
			r.Headers = append(r.Headers, envelope.Header{Key: k, Value: v})
		}
	}
	return r
}

func destination(_ *testing.T, key string) string { return "sinktest." + key }

func TestSinkConformanceJetStream(t *testing.T) {
	ns := testenv.NATS(t)
	nc := consumer(t, ns.URL)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const stream = "SINKTEST"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     stream,
		Subjects: []string{"sinktest.>"},
		Storage:  jetstream.FileStorage, // survives the broker restart
	}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	var unrouted atomic.Int64
	sinktest.Run(t, sinktest.Harness{
		Open:        openSink(ns.URL, true),
		Destination: destination,
		Consume: func(t *testing.T, dest string) <-chan sinktest.Received {
			t.Helper()
			ch := make(chan sinktest.Received, 10000)
			var cc jetstream.ConsumeContext
			var err error
			// Retried: right after a broker restart the consumer's
			// connection may not be back yet.
			ok := testenv.Poll(30*time.Second, func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				var cons jetstream.Consumer
				cons, err = js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
					FilterSubjects: []string{dest},
					DeliverPolicy:  jetstream.DeliverAllPolicy,
				})
				if err != nil {
					return false
				}
				cc, err = cons.Consume(func(m jetstream.Msg) { ch <- received(m.Headers(), m.Data()) })
				return err == nil
			})
			if !ok {
				t.Fatalf("consume %s: %v", dest, err)
			}
			t.Cleanup(cc.Stop)
			return ch
		},
		UnroutableDestination: func(*testing.T) string {
			return "unrouted." + strconv.FormatInt(unrouted.Add(1), 10) // no stream stores it
		},
		Features: sinktest.Features{
			Confirms:         true,
			BrokerID:         true,
			BrokerIDHeader:   envelope.HeaderNatsMsgID,
			Ordered:          true,
			Dedupe:           true,
			DuplicateHeaders: true,
			MaxBody:          maxBody,
			OversizeBody:     oversizeBody,
		},
		StopBroker:  func(*testing.T) { ns.Shutdown() },
		StartBroker: func(*testing.T) { ns.Restart() },
	})
}

// knownBugs are the NATS sink bugs the suite found (see the conformance
// report); they are skipped unless DELAYBRIDGE_CONFORMANCE_STRICT=1.
func TestSinkConformanceCoreNATS(t *testing.T) {
	ns := testenv.NATS(t)
	nc := consumer(t, ns.URL)
	sinktest.Run(t, sinktest.Harness{
		Open:        openSink(ns.URL, false),
		Destination: destination,
		Consume: func(t *testing.T, dest string) <-chan sinktest.Received {
			t.Helper()
			ch := make(chan sinktest.Received, 10000)
			sub, err := nc.Subscribe(dest, func(m *nats.Msg) { ch <- received(m.Header, m.Data) })
			if err != nil {
				t.Fatalf("subscribe %s: %v", dest, err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			// Core NATS keeps nothing: the subscription must reach the
			// server before anything is published.
			if err := nc.FlushTimeout(30 * time.Second); err != nil {
				t.Fatalf("flush subscription: %v", err)
			}
			return ch
		},
		Features: sinktest.Features{
			BrokerID:         true,
			BrokerIDHeader:   envelope.HeaderNatsMsgID,
			Ordered:          true,
			DuplicateHeaders: true,
			MaxBody:          maxBody,
			OversizeBody:     oversizeBody,
		},
		StopBroker:  func(*testing.T) { ns.Shutdown() },
		StartBroker: func(*testing.T) { ns.Restart() },
	})
}

// While the server is away, a publish fails at once and is not kept: the
// scheduler holds the message for the sink and publishes it again when the
// server is back, so a copy that nats.go kept in its reconnect buffer and
// sent on reconnect would be a second copy of every message published
// during the outage (test/fault counts each as a duplicate).
func TestSinkKeepsNothingWhileDisconnected(t *testing.T) {
	ns, js, _, sk := streamSink(t, jetstream.StreamConfig{Name: "KEPT", Subjects: []string{"kept.>"}, Storage: jetstream.FileStorage})
	ctx := context.Background()
	out := func(id string) sinks.Outgoing {
		return sinks.Outgoing{Attempt: 1, Message: &envelope.Message{ID: id, Destination: "kept.x", Body: []byte(id)}}
	}
	ns.Shutdown()
	r := sk.(sinks.Ready)
	testenv.Eventually(t, 10*time.Second, func() bool { return r.Ready() != nil }, "Ready still nil with the server down")
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	start := time.Now()
	errs := sk.Publish(pctx, []sinks.Outgoing{out("while-down-1"), out("while-down-2")})
	cancel()
	took := time.Since(start)
	for i, err := range errs {
		if err == nil || !sinks.IsUnavailable(err) {
			t.Errorf("message %d while the server is down: %v, want an unavailable error", i, err)
		}
	}
	if took > time.Second {
		t.Errorf("Publish took %v with the server down: it waited for its deadline instead of failing", took)
	}

	ns.Restart()
	testenv.Eventually(t, 10*time.Second, func() bool { return r.Ready() == nil }, "not reconnected")
	// A message after the reconnect: anything kept from before was flushed
	// ahead of it, so once it is stored, the stream holds all there is.
	var last error
	testenv.Eventually(t, 10*time.Second, func() bool {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		last = sk.Publish(pctx, []sinks.Outgoing{out("after")})[0]
		return last == nil
	}, "publish after the restart: %v", last)
	s, err := js.Stream(ctx, "KEPT")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("the stream holds %d messages, want only the one published after the restart: the failed publishes were sent on reconnect", info.State.Msgs)
	}
}

// A message to a subject too long for a publish's protocol line fails on
// its own (permanent): sent, it would make nats-server close the sink's
// connection, which nats.go does not reopen, and hold every message after
// it. The next message goes out.
func TestSinkRefusesASubjectTheServerWouldCloseFor(t *testing.T) {
	_, _, _, sk := streamSink(t, jetstream.StreamConfig{Name: "LONG", Subjects: []string{"long.>"}})
	ctx := context.Background()
	out := func(dest string) sinks.Outgoing {
		return sinks.Outgoing{Attempt: 1, Message: &envelope.Message{ID: "m", Destination: dest, Body: []byte("x")}}
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	errs := sk.Publish(pctx, []sinks.Outgoing{out("long." + strings.Repeat("x", 4100)), out("long.ok")})
	if errs[0] == nil || !sinks.IsPermanent(errs[0]) {
		t.Errorf("a subject of 4,105 bytes: %v, want a permanent error", errs[0])
	}
	if errs[1] != nil {
		t.Errorf("the next message: %v", errs[1])
	}
	if err := sk.(sinks.Ready).Ready(); err != nil {
		t.Errorf("the sink after it: %v", err)
	}
}

// A JetStream publish to a subject that no stream stores is refused at
// once ("no responders") unless a core NATS subscriber listens on it: the
// subscriber takes it and does not answer, and the publish times out. The
// sink then finds that no stream stores the subject and says so, with what
// to do, where the timeout named nothing to fix; the error stays a timeout
// (a stream of another domain or account may be the one that stalled).
func TestSinkNamesANoStreamSubjectACoreSubscriberTook(t *testing.T) {
	ns, _, _, sk := streamSink(t, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}})
	nc := consumer(t, ns.URL)
	sub, err := nc.SubscribeSync("orders.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the server knows the subscription
		t.Fatal(err)
	}
	out := func(dest string) sinks.Outgoing {
		return sinks.Outgoing{Attempt: 1, Message: &envelope.Message{ID: dest, Destination: dest, Body: []byte("x")}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	errs := sk.Publish(ctx, []sinks.Outgoing{out("orders.expired"), out("out.ok")})
	if err := errs[0]; !errors.Is(err, context.DeadlineExceeded) || sinks.IsRejected(err) ||
		!strings.Contains(err.Error(), `no stream of this account stores "orders.expired"`) || !strings.Contains(err.Error(), "core NATS subscriber") {
		t.Errorf("a subject no stream stores, with a core subscriber: %v, want a timeout naming the subject and the subscriber", err)
	}
	if errs[1] != nil {
		t.Errorf("a subject a stream stores: %v", errs[1])
	}
	if m, err := sub.NextMsg(5 * time.Second); err != nil || m.Subject != "orders.expired" {
		t.Errorf("the core subscriber got %v, %v; want the publish", m, err)
	}
}

// JetStream's duplicate window drops a publish whose Nats-Msg-Id it has
// seen, and the message's ID is that field. A new version of a delivered
// ID (a timer armed again, a replacement of a message already published)
// must still reach the stream; a publish of the same version again (its
// PubAck was lost) must not. A series' occurrence is the same.
func TestSinkPublishesANewVersionOfADeliveredID(t *testing.T) {
	_, _, stream, sk := streamSink(t, jetstream.StreamConfig{Name: "VERS", Subjects: []string{"vers.>"}, Duplicates: time.Minute})
	ctx := context.Background()
	t0 := time.Now().Truncate(time.Millisecond)
	version := func(body string, ingested time.Duration, recur bool) sinks.Outgoing {
		m := &envelope.Message{ID: "timer-7", Destination: "vers.x", Body: []byte(body), DueAt: t0.Add(ingested + time.Second), IngestedAt: t0.Add(ingested)}
		if recur {
			m.Recur = &envelope.Recurrence{Every: time.Second, Anchor: m.DueAt, N: 1}
		}
		return sinks.Outgoing{Attempt: 1, Message: m}
	}
	for _, step := range []struct {
		what string
		out  sinks.Outgoing
		want uint64 // messages in the stream after it
	}{
		{"the first version", version("armed", 0, false), 1},
		{"the first version again (its PubAck lost)", version("armed", 0, false), 1},
		{"a new version of the delivered ID", version("armed again", time.Minute, false), 2},
		{"that version again", version("armed again", time.Minute, false), 2},
		{"a third version", version("armed a third time", 2*time.Minute, false), 3},
		{"a series' first occurrence", version("series", 3*time.Minute, true), 4},
		{"a new series of the ID", version("series again", 4*time.Minute, true), 5},
		{"its first occurrence again", version("series again", 4*time.Minute, true), 5},
	} {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := sk.Publish(pctx, []sinks.Outgoing{step.out})[0]
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != step.want {
			t.Errorf("after %s the stream holds %d messages, want %d", step.what, info.State.Msgs, step.want)
		}
	}
}

// streamSink starts a nats-server with the stream cfg and a JetStream sink
// on it (closed at the end of the test).
func streamSink(t *testing.T, cfg jetstream.StreamConfig) (*testenv.NATSServer, jetstream.JetStream, jetstream.Stream, sinks.Sink) {
	t.Helper()
	ns := testenv.NATS(t)
	js, err := jetstream.New(consumer(t, ns.URL))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	sk := openSink(ns.URL, true)(t)
	t.Cleanup(func() { _ = sk.Close() })
	return ns, js, stream, sk
}

// TestSinkAFullStreamIsItsDestinationsFault: a stream at its max_msgs
// with discard new answers a publish with a 503 (JSStreamStoreFailedF).
// That is the stream's refusal of the message, an attempt of it, not the
// sink being unavailable, which held every destination of the sink
// behind the full one and never counted an attempt.
func TestSinkAFullStreamIsItsDestinationsFault(t *testing.T) {
	_, js, _, sk := streamSink(t, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}})
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "FULL", Subjects: []string{"full.>"},
		MaxMsgs: 1, Discard: jetstream.DiscardNew}); err != nil {
		t.Fatal(err)
	}
	out := func(id, dest string) sinks.Outgoing {
		return sinks.Outgoing{Attempt: 1, Message: &envelope.Message{ID: id, Destination: dest, Body: []byte("x")}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := sk.Publish(ctx, []sinks.Outgoing{out("a", "full.a"), out("b", "full.b"), out("c", "out.ok")})
	if errs[0] != nil {
		t.Errorf("the first message to the stream with room: %v", errs[0])
	}
	if err := errs[1]; !sinks.IsRejected(err) || sinks.IsUnavailable(err) || sinks.IsSent(err) ||
		sinks.ReasonOf(err) != sinks.ReasonRejected || !strings.Contains(err.Error(), "maximum messages exceeded") || !strings.Contains(err.Error(), "discard new") {
		t.Errorf("a message to the full stream: %v (rejected %v, unavailable %v, reason %q); want rejected, naming the limit and what to change",
			err, sinks.IsRejected(err), sinks.IsUnavailable(err), sinks.ReasonOf(err))
	}
	if errs[2] != nil {
		t.Errorf("a message to another stream, in the same batch: %v", errs[2])
	}
}

// TestSinkLeavesOutJetStreamPublishDirectives: a publisher's
// Nats-Expected-Stream (nats.go's ExpectStream, for its publish to the
// ingest's stream) made the sink's stream refuse the message ("expected
// stream does not match") until it was dead, as did the Nats-Stream-Source
// of a message read from a stream that sources others; a rollup or a TTL
// would act on the sink's stream. Other headers go on.
func TestSinkLeavesOutJetStreamPublishDirectives(t *testing.T) {
	_, _, stream, sk := streamSink(t, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}})
	m := &envelope.Message{ID: "d1", Destination: "out.d", Body: []byte("x"), Headers: envelope.Headers{
		{Key: "Nats-Expected-Stream", Value: "INGEST"}, {Key: "nats-expected-last-sequence", Value: "7"},
		{Key: "Nats-Rollup", Value: "sub"}, {Key: "Nats-TTL", Value: "1s"}, {Key: "Nats-Trace-Only", Value: "true"},
		{Key: "Nats-Stream-Source", Value: "ORDERS 12 orders.a orders.a"}, {Key: "Nats-Scheduler", Value: "sched.a"},
		{Key: "Nats-Schedule-Next", Value: "2026-12-07T00:00:00Z"}, {Key: "x-custom", Value: "c"}, {Key: "Nats-Expectation", Value: "kept"},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if errs := sk.Publish(ctx, []sinks.Outgoing{{Attempt: 1, Message: m}}); errs[0] != nil {
		t.Fatalf("publish with a publisher's JetStream directives: %v", errs[0])
	}
	got, err := stream.GetLastMsgForSubject(ctx, "out.d")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"Nats-Expected-Stream", "Nats-Expected-Last-Sequence", "Nats-Rollup", "Nats-TTL", "Nats-Trace-Only", "Nats-Stream-Source", "Nats-Scheduler", "Nats-Schedule-Next"} {
		for hk := range got.Header {
			if strings.EqualFold(hk, k) {
				t.Errorf("%s was sent to the sink's stream", hk)
			}
		}
	}
	if got.Header.Get("x-custom") != "c" || got.Header.Get("Nats-Expectation") != "kept" {
		t.Errorf("headers %v: want x-custom and Nats-Expectation (no directive) kept", got.Header)
	}
}

// TestSinkNotReadyWhileItsServerAnswersNothing: a server that keeps the
// connection and answers nothing (kill -STOP, a network that drops
// packets) left the sink ready for minutes (nats.go's default PINGs, every
// 2 minutes): it is not ready once its PINGs go unanswered, and ready
// again when the server answers.
func TestSinkNotReadyWhileItsServerAnswersNothing(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	px := testenv.NewProxy(t, strings.TrimPrefix(ns.URL, "nats://"))
	s := openSink("nats://"+px.Addr, false)(t)
	t.Cleanup(func() { _ = s.Close() })
	sk := s.(*natsbroker.Sink)
	if err := sk.Ready(); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	px.Stall()
	start := time.Now()
	testenv.Eventually(t, 30*time.Second, func() bool { return sk.Ready() != nil }, "Ready to fail while the server answers nothing")
	t.Logf("not ready after %v: %v", time.Since(start).Round(100*time.Millisecond), sk.Ready())
	px.Flow()
	testenv.Eventually(t, 30*time.Second, func() bool { return sk.Ready() == nil }, "Ready once the server answers: %v", sk.Ready())
}

// A stream's 503 JSStreamStoreFailed is the destination's refusal when it
// is full or too small for the message, and the sink's when the stream is
// closing (a restart, a leader change): that passes.
func TestClassifyStreamStoreFailed(t *testing.T) {
	for _, c := range []struct {
		desc     string
		rejected bool
		reason   sinks.Reason
	}{
		{"maximum messages exceeded", true, sinks.ReasonRejected},
		{"maximum bytes exceeded", true, sinks.ReasonRejected},
		{"maximum messages per subject exceeded", true, sinks.ReasonRejected},
		{"message too large", true, sinks.ReasonTooLarge},
		{"store is closed", false, sinks.ReasonUnavailable},
	} {
		err := natsbroker.Classify(&jetstream.APIError{Code: 503, ErrorCode: 10077, Description: c.desc})
		if sinks.IsRejected(err) != c.rejected || sinks.ReasonOf(err) != c.reason {
			t.Errorf("%q: %v (rejected %v, reason %q), want rejected %v, reason %q", c.desc, err, sinks.IsRejected(err), sinks.ReasonOf(err), c.rejected, c.reason)
		}
	}
}

// A publish answered "duplicate message id is in process" (a 409, 10158)
// was counted as the stream refusing the message: it is a publish of the
// same ID sent before, in the stream's log of a cluster without quorum,
// which the stream stores when the quorum is back (a probe: 683 messages
// dead within 9 s of their due time, and stored all the same). In doubt:
// sinks.Again, not counted, maybe sent.
func TestClassifyDuplicateInProcessIsInDoubt(t *testing.T) {
	err := natsbroker.Classify(&jetstream.APIError{Code: 409, ErrorCode: 10158, Description: "duplicate message id is in process"})
	if !sinks.IsAgain(err) || sinks.IsRejected(err) || sinks.IsPermanent(err) || !strings.Contains(err.Error(), "may be stored") {
		t.Errorf("duplicate in process: %v (again %v, rejected %v); want in doubt, not counted", err, sinks.IsAgain(err), sinks.IsRejected(err))
	}
}

// TestSinkReadyAnswersWhileRedialling: nats.go holds a connection's lock
// while it dials a server again, and its Status waited for it, up to the
// connect timeout: /readyz took that long while a server took connections
// and answered nothing. Ready answers from the state the connection's
// handlers last said.
func TestSinkReadyAnswersWhileRedialling(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	px := testenv.NewProxy(t, strings.TrimPrefix(ns.URL, "nats://"))
	s, err := natsbroker.NewSink(natsbroker.SinkParams{Name: "redial", URL: "nats://" + px.Addr,
		Options: []nats.Option{nats.Timeout(30 * time.Second)}}, slog.New(slog.DiscardHandler)) // a handshake that waits long
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Flow(); _ = s.Close() })
	px.Stall()
	testenv.Eventually(t, 40*time.Second, func() bool { return s.Ready() != nil }, "Ready to fail while the server answers nothing")
	// Now it dials again through the stalled proxy, its handshake waiting:
	// Ready answers at once all along.
	for range 10 {
		start := time.Now()
		err := s.Ready()
		if took := time.Since(start); took > 5*time.Second || err == nil {
			t.Fatalf("Ready while redialling: %v after %v; want a failure at once (the handshake waits up to 30 s)", err, took.Round(time.Millisecond))
		}
		<-time.After(200 * time.Millisecond) // spacing of the samples, not a wait for an event
	}
}

// A server shutting down stops JetStream before it closes its
// connections: a publish meanwhile gets "no responders", as one to a
// subject no stream stores does. That is the sink being unavailable (the
// message is held, no attempt counted), not the message refused (the soak
// probe saw 11 messages sent again as attempt 2 at a NATS restart).
func TestSinkJetStreamGoneIsNotTheMessagesFault(t *testing.T) {
	ns, _, _, sk := streamSink(t, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}})
	out := sinks.Outgoing{Attempt: 1, Message: &envelope.Message{ID: "m", Destination: "out.x", Body: []byte("x")}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if errs := sk.Publish(ctx, []sinks.Outgoing{out}); errs[0] != nil {
		t.Fatalf("with JetStream: %v", errs[0])
	}
	ns.Server.DisableJetStream()
	errs := sk.Publish(ctx, []sinks.Outgoing{out})
	if errs[0] == nil || sinks.IsRejected(errs[0]) || !sinks.IsUnavailable(errs[0]) || !strings.Contains(errs[0].Error(), "JetStream does not answer") {
		t.Fatalf("JetStream gone: %v, want the sink unavailable, not the message refused", errs[0])
	}
}

// TestSinkASilentDestinationDoesNotStallTheOthers: nats.go keeps each
// JetStream publish until its PubAck comes, up to a bound per sink, and
// each publish past the bound waited 200 ms and failed as the sink's.
// A subject whose core subscriber takes publishes without answering, at
// volume, filled the bound with PubAcks that never come, kept a minute
// each: every other publish of the sink failed meanwhile, and the
// messages the batch's time ran out for were counted as their own
// destinations' timeouts (a probe: 14,674 of 30,000 healthy messages
// dead). A PubAck is now awaited for the publish timeout, and a publish
// that finds the bound full is not sent (sinks.NotSent), quickly, with the
// rest of its batch.
func TestSinkASilentDestinationDoesNotStallTheOthers(t *testing.T) {
	ns := testenv.NATS(t)
	js, err := jetstream.New(consumer(t, ns.URL))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}}); err != nil {
		t.Fatal(err)
	}
	silent := consumer(t, ns.URL)
	sub, err := silent.SubscribeSync("silent.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := silent.Flush(); err != nil {
		t.Fatal(err)
	}
	const bound, timeout = 50, 300 * time.Millisecond
	sk, err := natsbroker.NewSink(natsbroker.WithMaxPending(natsbroker.SinkParams{Name: "s", URL: ns.URL, JetStream: true, PublishTimeout: timeout}, bound),
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sk.Close() })
	batch := func(prefix, dest string, n int) []sinks.Outgoing {
		out := make([]sinks.Outgoing, n)
		for i := range out {
			out[i] = sinks.Outgoing{Attempt: 1, Message: &envelope.Message{ID: prefix + strconv.Itoa(i), Destination: dest, Body: []byte("x")}}
		}
		return out
	}

	// The bound's worth of publishes to the silent subject time out; the
	// rest of the batch is not sent, and says so.
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	errs := sk.Publish(ctx, batch("silent-", "silent.x", bound+30))
	cancel()
	for i, err := range errs {
		switch {
		case i < bound && (!errors.Is(err, context.DeadlineExceeded) || sinks.IsNotSent(err)):
			t.Errorf("silent publish %d, sent: %v; want a timeout", i, err)
		case i >= bound && (!sinks.IsNotSent(err) || sinks.IsUnavailable(err) || sinks.IsSent(err) || sinks.ReasonOf(err) != sinks.ReasonUnavailable ||
			!strings.Contains(err.Error(), "PubAcks awaited")):
			t.Errorf("silent publish %d, past the bound: %v (not sent %v, unavailable %v, sent %v, reason %q); want not sent, saying why",
				i, err, sinks.IsNotSent(err), sinks.IsUnavailable(err), sinks.IsSent(err), sinks.ReasonOf(err))
		}
	}
	for i := range bound {
		if _, err := sub.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("the silent subscriber got %d publishes: %v", i, err)
		}
	}
	if err := silent.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := sub.Pending(); n != 0 {
		t.Errorf("the silent subscriber got %d publishes past the bound's %d: sent although said not sent", n, bound)
	}

	// The healthy stream's publishes go through once the silent PubAcks
	// are dropped, the publish timeout after they were sent, not a minute;
	// until then each is not sent, never a failure of its own.
	pending := batch("ok-", "out.x", 20)
	testenv.Eventually(t, 5*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var left []sinks.Outgoing
		for i, err := range sk.Publish(ctx, pending) {
			switch {
			case err == nil:
			case sinks.IsNotSent(err):
				left = append(left, pending[i])
			default:
				t.Fatalf("a healthy publish failed: %v", err)
			}
		}
		pending = left
		return len(pending) == 0
	}, "every healthy publish confirmed")
}

// TestSinkOpenTakesThePublishTimeout: the daemon gives Open its
// scheduler.publish_timeout (sinks.WithPublishTimeout), the longest a
// PubAck is waited for.
func TestSinkOpenTakesThePublishTimeout(t *testing.T) {
	ns := testenv.NATS(t)
	ctx := sinks.WithPublishTimeout(context.Background(), 7*time.Second)
	sk, err := (&natsbroker.SinkConfig{URL: ns.URL, JetStream: true}).Open(ctx, "s", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sk.Close() })
	if got := natsbroker.PublishTimeoutOf(sk); got != 7*time.Second {
		t.Errorf("the sink waits %s for a PubAck, want scheduler.publish_timeout 7s", got)
	}
}

// TestSinkAStreamWithoutItsLeaderIsDownNotCounted: two servers of a
// three-node JetStream cluster killed leave a replicated stream without
// its leader, while a stream of one replica on the server the sink talks
// to goes on. The server then answers each publish to the first at once
// with "no responders", and the account's questions with a 503
// ("JetStream system temporarily unavailable"), which the sink took for
// JetStream answering: every message to the stream counted an attempt as
// "no stream stores this subject" and was dead in seconds (a probe: 6,080
// of 18,000). It is the stream down for now (sinks.Down): not counted,
// not the sink's, and the other stream's messages go on.
func TestSinkAStreamWithoutItsLeaderIsDownNotCounted(t *testing.T) {
	nodes := testenv.NATSCluster(t, 3)
	_, js := testenv.ConnectNATS(t, nodes[0].URL)
	for _, cfg := range []jetstream.StreamConfig{
		{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3},
		{Name: "R1", Subjects: []string{"r1.>"}, Replicas: 1, Placement: &jetstream.Placement{Tags: []string{nodes[0].Tag}}},
	} {
		testenv.Eventually(t, 30*time.Second, func() bool {
			_, err := js.CreateStream(context.Background(), cfg)
			return err == nil
		}, "stream "+cfg.Name+" created")
	}
	sk, err := natsbroker.NewSink(natsbroker.SinkParams{Name: "s", URL: nodes[0].URL, JetStream: true, PublishTimeout: 2 * time.Second}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sk.Close() })
	n := 0
	publish := func() []error {
		n++
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return sk.Publish(ctx, []sinks.Outgoing{ // a subject of its own for each (an entity's ID in it)
			{Attempt: 1, Message: &envelope.Message{ID: "r3-" + strconv.Itoa(n), Destination: "r3." + strconv.Itoa(n), Body: []byte("x")}},
			{Attempt: 1, Message: &envelope.Message{ID: "r1-" + strconv.Itoa(n), Destination: "r1.x", Body: []byte("x")}},
		})
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		errs := publish()
		return errs[0] == nil && errs[1] == nil
	}, "both streams take publishes")

	for _, nd := range nodes[1:] {
		nd.Server.Shutdown()
		nd.Server.WaitForShutdown()
	}
	var last []error
	testenv.Eventually(t, 90*time.Second, func() bool {
		last = publish()
		for i, err := range last {
			if sinks.IsRejected(err) || sinks.IsPermanent(err) {
				t.Fatalf("publish %d to %s counted an attempt: %v", n, []string{"r3." + strconv.Itoa(n), "r1.x"}[i], err)
			}
		}
		// Down first perhaps as the stream the account's JetStream still
		// names, until the cluster says it is unavailable (503): then as
		// the stream of the subject while the sink's others take theirs.
		return sinks.IsDown(last[0]) && strings.Contains(last[0].Error(), "while JetStream stores the sink's other publishes") && last[1] == nil
	}, "the stream without its leader down while the cluster's JetStream is unavailable, the other stream taking publishes")
	if err := last[0]; sinks.IsUnavailable(err) || sinks.IsSent(err) || sinks.ReasonOf(err) != sinks.ReasonUnavailable || !strings.Contains(err.Error(), `"r3.`+strconv.Itoa(n)+`"`) {
		t.Errorf("the stream without its leader: %v (unavailable %v, sent %v, reason %q); want down, naming the subject", err, sinks.IsUnavailable(err), sinks.IsSent(err), sinks.ReasonOf(err))
	}
}
