package natsbroker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// TestProbeTellsASilentSubjectFromASilentServer: a JetStream publish to a
// subject whose PubAck never comes (its stream sends none: NoAck) times
// out, while the sink's probe answers: the server and its
// JetStream do. A server that is gone, or that runs without JetStream,
// does not answer the probe (the scheduler then takes the timeout for the
// sink being down).
func TestProbeTellsASilentSubjectFromASilentServer(t *testing.T) {
	ns := testenv.NATS(t)
	js, err := jetstream.New(consumer(t, ns.URL))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "SILENT", Subjects: []string{"silent.x"}, NoAck: true}); err != nil {
		t.Fatal(err)
	}
	sk := openSink(ns.URL, true)(t)
	defer sk.Close()
	probe := func(sk sinks.Sink) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return sk.(sinks.Prober).Probe(ctx)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err = sk.Publish(ctx, []sinks.Outgoing{{Attempt: 1, Message: &envelope.Message{ID: "s", Destination: "silent.x", Body: []byte("s")}}})[0]
	cancel()
	if err == nil || !sinks.IsUnavailable(err) || ctx.Err() == nil {
		t.Fatalf("publish to a subject that never answers: %v, want a timeout", err)
	}
	if err := probe(sk); err != nil {
		t.Fatalf("probe of a JetStream that answers: %v", err)
	}
	core := openSink(ns.URL, false)(t)
	defer core.Close()
	if err := probe(core); err != nil {
		t.Fatalf("probe of a core NATS server that answers: %v", err)
	}

	ns.Shutdown()
	testenv.Eventually(t, 10*time.Second, func() bool { return sk.(sinks.Ready).Ready() != nil }, "Ready still nil with the server down")
	if err := probe(sk); err == nil {
		t.Error("probe answered with the server down")
	}

	port := testenv.FreePort(t)
	plain, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go plain.Start()
	t.Cleanup(plain.Shutdown)
	if !plain.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server without JetStream not ready")
	}
	noJS := openSink(fmt.Sprintf("nats://127.0.0.1:%d", port), true)(t)
	defer noJS.Close()
	if err := probe(noJS); err == nil {
		t.Error("probe answered by a server without JetStream")
	}
}
