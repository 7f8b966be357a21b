package rabbitbroker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
)

func newSource(t testing.TB, url, queue string, prefetch int) *rabbitbroker.Source {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := rabbitbroker.NewSource(ctx, rabbitbroker.SourceParams{Name: "test", URL: url, Queue: queue, Prefetch: prefetch}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func read(t testing.TB, s ingest.Source) (*envelope.Incoming, ingest.AckFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in, ack, err := s.Read(ctx)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return in, ack
}

func closeSource(t testing.TB, s ingest.Source) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
}

func TestSourceRoundTrip(t *testing.T) {
	node := testenv.RabbitMQ(t)
	q := unique(t)
	s := newSource(t, node.URL, q, 10) // declares the missing queue
	a := newAdmin(t, node.URL)
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	body := []byte("body\x00with\xffbinary")
	a.publish(q, amqp.Publishing{
		MessageId: "m-1",
		Timestamp: ts,
		Body:      body,
		Headers: amqp.Table{
			"x-delay":    int32(5000), // as RabbitMQ's delayed-exchange publishers send it
			"x-deliver":  "no",
			"X-Custom":   "v",
			"bin":        []byte{1, 2},
			"flag":       false,
			"n64":        int64(-42),
			"when":       ts,
			"nested":     amqp.Table{"k": int32(1)},
			"x-delay-id": "z",
		},
	})
	in, ack := read(t, s)
	if string(in.Body) != string(body) {
		t.Errorf("body %q, want %q", in.Body, body)
	}
	if in.NativeID != "m-1" || !in.PublishedAt.IsZero() || in.Origin.PositionID() != "" || in.Key != nil {
		t.Errorf("NativeID %q PublishedAt %v PositionID %q Key %q", in.NativeID, in.PublishedAt, in.Origin.PositionID(), in.Key)
	}
	want := envelope.Headers{
		{Key: "X-Custom", Value: "v"}, {Key: "bin", Value: "\x01\x02"}, {Key: "flag", Value: "false"},
		{Key: "n64", Value: "-42"}, {Key: "nested", Value: `{"k":1}`}, {Key: "when", Value: "2026-01-02T03:04:05Z"},
		{Key: "x-delay", Value: "5000"}, {Key: "x-delay-id", Value: "z"}, {Key: "x-deliver", Value: "no"},
	}
	// The string forms; a header that is not a string also has its native
	// value (TestHeaderTypesAndPropertiesSurvive checks those).
	plain := make(envelope.Headers, len(in.Headers))
	for i, h := range in.Headers {
		if strings.HasPrefix(h.Key, "x-delay-") || h.Key == "X-Custom" || h.Key == "x-deliver" {
			if h.Native != "" {
				t.Errorf("string header %s has native %q", h.Key, h.Native)
			}
		} else if h.Native == "" {
			t.Errorf("typed header %s has no native value", h.Key)
		}
		plain[i] = envelope.Header{Key: h.Key, Value: h.Value}
	}
	if fmt.Sprint(plain) != fmt.Sprint(want) {
		t.Errorf("headers\n got %q\nwant %q", plain, want)
	}
	if len(in.Properties) != 1 || in.Properties[0].Key != rabbitbroker.PropTimestamp || in.Properties[0].Value != "2026-01-02T03:04:05Z" {
		t.Errorf("properties %q, want the timestamp", in.Properties)
	}
	if d, reason := envelope.ParseDelay(mustGet(t, in.Headers, "x-delay")); reason != "" || d != 5*time.Second {
		t.Errorf("x-delay: %v %s", d, reason)
	}
	if err := ack(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(); err != nil {
		t.Errorf("Ready: %v", err)
	}
	closeSource(t, s)
	if _, _, err := s.Read(context.Background()); !errors.Is(err, ingest.ErrClosed) {
		t.Errorf("Read after Close: %v, want ErrClosed", err)
	}
	if s.Ready() == nil {
		t.Error("Ready after Close: nil")
	}
	// Acked: nothing comes back. (Checked again after a marker below.)
	a.publishIDs(q, "marker")
	s2 := newSource(t, node.URL, q, 10)
	if in, ack := read(t, s2); in.NativeID != "marker" {
		t.Errorf("after ack and reopen: got %q, want the marker", in.NativeID)
	} else {
		_ = ack(context.Background(), nil)
	}
}

func mustGet(t *testing.T, h envelope.Headers, key string) string {
	t.Helper()
	v, ok := h.Get(key)
	if !ok {
		t.Fatalf("no header %q", key)
	}
	return v
}

// A message is acked only by AckFunc(nil): the others come back after the
// Source closed, and come back exactly (the acked one does not).
func TestSourceAckOnlyAfterAckFunc(t *testing.T) {
	node := testenv.RabbitMQ(t)
	q := unique(t)
	s := newSource(t, node.URL, q, 10)
	a := newAdmin(t, node.URL)
	a.publishIDs(q, "a", "b", "c")
	var acks []ingest.AckFunc
	for _, want := range []string{"a", "b", "c"} {
		in, ack := read(t, s)
		if in.NativeID != want {
			t.Fatalf("got %q, want %q", in.NativeID, want)
		}
		acks = append(acks, ack)
	}
	if err := acks[1](context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return a.ready(q) == 0 }, "all delivered")
	closeSource(t, s)
	// The unacked two are requeued together when the channel closes; the
	// count goes from 0 to 2 (or 3 if "b" had not been acked).
	testenv.Eventually(t, 10*time.Second, func() bool { return a.ready(q) == 2 }, "2 requeued")
	if err := acks[0](context.Background(), nil); err == nil {
		t.Error("AckFunc after Close: nil error, want one")
	}

	s2 := newSource(t, node.URL, q, 10)
	got := map[string]bool{}
	for range 2 {
		in, ack := read(t, s2)
		got[in.NativeID] = true
		if err := ack(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
	if !got["a"] || !got["c"] {
		t.Errorf("redelivered %v, want a and c", got)
	}
	closeSource(t, s2)
	testenv.Eventually(t, 10*time.Second, func() bool { return a.ready(q) == 0 }, "queue empty")
}

func TestSourceNackRequeues(t *testing.T) {
	node := testenv.RabbitMQ(t)
	q := unique(t)
	s := newSource(t, node.URL, q, 10)
	a := newAdmin(t, node.URL)
	a.publishIDs(q, "n")
	in, ack := read(t, s)
	if err := ack(context.Background(), errors.New("redis down")); err != nil {
		t.Fatal(err)
	}
	in2, ack2 := read(t, s)
	if in2.NativeID != in.NativeID {
		t.Fatalf("after nack got %q, want %q again", in2.NativeID, in.NativeID)
	}
	if err := ack2(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	closeSource(t, s)
	// Acked now: after the close nothing is requeued (a marker comes first).
	a.publishIDs(q, "marker")
	s2 := newSource(t, node.URL, q, 10)
	if in, _ := read(t, s2); in.NativeID != "marker" {
		t.Errorf("got %q, want the marker", in.NativeID)
	}
}

func TestSourcePrefetchLimitsUnacked(t *testing.T) {
	node := testenv.RabbitMQ(t)
	q := unique(t)
	s := newSource(t, node.URL, q, 5)
	a := newAdmin(t, node.URL)
	ids := make([]string, 20)
	for i := range ids {
		ids[i] = fmt.Sprint("p", i)
	}
	a.publishIDs(q, ids...)
	var acks []ingest.AckFunc
	for range 5 {
		_, ack := read(t, s)
		acks = append(acks, ack)
	}
	// The broker sent 5 and holds the other 15 until an ack.
	testenv.Eventually(t, 10*time.Second, func() bool { return a.ready(q) == 15 }, "15 ready")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, _, err := s.Read(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("6th read with 5 unacked: %v, want a timeout", err)
	}
	if a.ready(q) != 15 {
		t.Fatalf("ready %d, want 15", a.ready(q))
	}
	if err := acks[0](context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	read(t, s) // one more after one ack
	testenv.Eventually(t, 10*time.Second, func() bool { return a.ready(q) == 14 }, "14 ready")
}

func TestSourceSend(t *testing.T) {
	node := testenv.RabbitMQ(t)
	q := unique(t)
	s := newSource(t, node.URL, q, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := envelope.Headers{{Key: "x-delay", Value: "1500ms"}, {Key: "x-message-id", Value: "sent-1"}, {Key: "k", Value: "v1"}, {Key: "k", Value: "v2"}}
	if err := rabbitbroker.Send(ctx, rabbitbroker.SourceParams{URL: node.URL, Queue: q}, ingest.Publication{Headers: h, Body: []byte("payload")}); err != nil {
		t.Fatal(err)
	}
	in, ack := read(t, s)
	want := envelope.Headers{{Key: "k", Value: "v1"}, {Key: "x-delay", Value: "1500ms"}, {Key: "x-message-id", Value: "sent-1"}}
	if fmt.Sprint(in.Headers) != fmt.Sprint(want) || string(in.Body) != "payload" {
		t.Errorf("got %q %q", in.Headers, in.Body)
	}
	_ = ack(ctx, nil)

	err := rabbitbroker.Send(ctx, rabbitbroker.SourceParams{URL: node.URL, Queue: q + "-missing"}, ingest.Publication{Headers: h, Body: []byte("x")})
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("send to a missing queue: %v", err)
	}
	err = rabbitbroker.Send(ctx, rabbitbroker.SourceParams{URL: "amqp://guest:wrong@127.0.0.1:" + fmt.Sprint(node.Port) + "/", Queue: q}, ingest.Publication{Headers: h})
	if err == nil || strings.Contains(err.Error(), "wrong") {
		t.Errorf("send with bad credentials: %v (must fail without showing the password)", err)
	}
}

// quorumQueue declares a quorum queue of the test's own.
func quorumQueue(t *testing.T, a *admin) string {
	t.Helper()
	q := unique(t)
	if _, err := a.ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		t.Fatal(err)
	}
	return q
}

// An existing queue is used as it is, quorum queues included.
func TestSourceExistingQuorumQueue(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := quorumQueue(t, a)
	s := newSource(t, node.URL, q, 10)
	a.publishIDs(q, "q1")
	in, ack := read(t, s)
	if in.NativeID != "q1" {
		t.Fatalf("got %q", in.NativeID)
	}
	if err := ack(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	closeSource(t, s)
	testenv.Eventually(t, 10*time.Second, func() bool { return a.ready(q) == 0 }, "acked")
}

// A quorum queue counts a message's deliveries in a header it adds
// (x-delivery-count): the redelivery is still the same content, with the
// same print, so that the store knows it for a re-read.
func TestQuorumRedeliveryKeepsItsPrint(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := quorumQueue(t, a)
	s := newSource(t, node.URL, q, 10)
	a.publishIDs(q, "q1")
	in, ack := read(t, s)
	if err := ack(context.Background(), errors.New("redis down")); err != nil { // nack: requeued
		t.Fatal(err)
	}
	in2, ack2 := read(t, s)
	if err := ack2(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if _, counted := in2.Headers.Get("x-delivery-count"); !in2.Redelivered || !counted {
		t.Fatalf("the redelivery: redelivered %v, headers %v; want it redelivered with x-delivery-count", in2.Redelivered, in2.Headers)
	}
	if in.Origin.Print == 0 || in2.Origin.Print != in.Origin.Print {
		t.Errorf("print %x of the delivery, %x of its redelivery: want the same", in.Origin.Print, in2.Origin.Print)
	}
}

func TestSourceNewFailsOnBadURL(t *testing.T) {
	node := testenv.RabbitMQ(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := rabbitbroker.NewSource(ctx, rabbitbroker.SourceParams{Name: "bad", URL: fmt.Sprintf("amqp://guest:secret@127.0.0.1:%d/novhost", node.Port), Queue: "q", Prefetch: 10}, quiet)
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("New with a missing vhost: %v", err)
	}
}

// The broker restarts while messages flow: the Source reports the outage,
// reconnects, loses nothing, and an AckFunc from the old channel acks
// nothing on the new one. Not parallel: it stops the shared node.
func TestSourceBrokerRestart(t *testing.T) {
	node := testenv.RabbitMQ(t)
	q := unique(t)
	s := newSource(t, node.URL, q, 20)
	a := newAdmin(t, node.URL)
	const n = 300
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("r%03d", i)
	}
	a.publishIDs(q, ids[:n/2]...)

	// Keep the first delivery (tag 1) unsettled; read and ack more.
	seen := map[string]int{}
	stale, staleAck := read(t, s)
	seen[stale.NativeID]++
	for range n / 4 {
		in, ack := read(t, s)
		seen[in.NativeID]++
		if err := ack(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}

	node.Stop(t)
	testenv.Eventually(t, 10*time.Second, func() bool { return s.Ready() != nil }, "Ready reports the outage")
	if err := s.Ready(); !strings.Contains(err.Error(), "disconnected") {
		t.Errorf("Ready during the outage: %v", err)
	}
	// Reads block meanwhile (nothing is lost or invented).
	node.Start(t)
	testenv.Eventually(t, 60*time.Second, func() bool { return s.Ready() == nil }, "reconnected")

	a = newAdmin(t, node.URL)
	a.publishIDs(q, ids[n/2:]...)

	// The first delivery on the new channel has delivery tag 1, like the
	// stale one: the stale AckFunc must not ack it.
	first, firstAck := read(t, s)
	seen[first.NativeID]++
	err := staleAck(context.Background(), nil)
	if !errors.Is(err, rabbitbroker.ErrStaleDelivery) {
		t.Fatalf("stale AckFunc: %v, want ErrStaleDelivery", err)
	}
	// Everything not acked before the restart arrives (redeliveries allowed).
	for len(seen) < n || seen[stale.NativeID] < 2 {
		in, ack := read(t, s)
		seen[in.NativeID]++
		if err := ack(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		if seen[id] == 0 {
			t.Errorf("%s lost", id)
		}
	}
	// "first" is still unacked: closing requeues exactly it.
	closeSource(t, s)
	testenv.Eventually(t, 10*time.Second, func() bool { return a.ready(q) == 1 }, "the unacked first delivery requeued")
	s2 := newSource(t, node.URL, q, 10)
	if in, ack := read(t, s2); in.NativeID != first.NativeID {
		t.Errorf("requeued %q, want %q", in.NativeID, first.NativeID)
	} else {
		_ = ack(context.Background(), nil)
	}
	_ = firstAck
}

// AckFuncs may run concurrently with Read and with each other.
func TestSourceConcurrentAcks(t *testing.T) {
	node := testenv.RabbitMQ(t)
	q := unique(t)
	s := newSource(t, node.URL, q, 200)
	a := newAdmin(t, node.URL)
	const n = 2000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint("c", i)
	}
	a.publishIDs(q, ids...)
	acks := make(chan ingest.AckFunc, 100)
	var wg sync.WaitGroup
	var failed sync.Map
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ack := range acks {
				if err := ack(context.Background(), nil); err != nil {
					failed.Store(err.Error(), true)
				}
			}
		}()
	}
	start := time.Now()
	for range n {
		_, ack := read(t, s)
		acks <- ack
	}
	close(acks)
	wg.Wait()
	t.Logf("consumed and acked %d in %v (%.0f msg/s)", n, time.Since(start), n/time.Since(start).Seconds())
	failed.Range(func(k, _ any) bool { t.Errorf("ack: %v", k); return true })
	closeSource(t, s)
	testenv.Eventually(t, 10*time.Second, func() bool { return a.ready(q) == 0 }, "all acked")
}

// ConfirmAcks returns nil once the broker answered a synchronous method
// sent after the acks on their channel; when that channel closed before,
// it says it cannot know.
func TestSourceConfirmAcks(t *testing.T) {
	node := testenv.RabbitMQ(t)
	q := unique(t)
	s := newSource(t, node.URL, q, 10)
	a := newAdmin(t, node.URL)
	ctx := context.Background()
	if err := s.ConfirmAcks(ctx, s.AckMark()); err != nil {
		t.Fatalf("nothing acked: %v", err)
	}
	mark := s.AckMark()
	a.publishIDs(q, "a", "b")
	for range 2 {
		_, ack := read(t, s)
		if err := ack(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.ConfirmAcks(ctx, mark); err != nil {
		t.Fatalf("ConfirmAcks: %v", err)
	}

	// Two batches: the first one's confirm does not vouch for the second
	// one's acks once their channel has closed.
	a.publishIDs(q, "c", "d")
	first := s.AckMark()
	_, ack := read(t, s)
	if err := ack(ctx, nil); err != nil {
		t.Fatal(err)
	}
	second := s.AckMark()
	_, ack = read(t, s)
	if err := ack(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.ConfirmAcks(ctx, first); err != nil {
		t.Fatalf("ConfirmAcks of the first: %v", err)
	}
	a.publishIDs(q, "e")
	_, ackE := read(t, s)
	if err := s.Release(ctx); err != nil { // the channel closes
		t.Fatal(err)
	}
	if err := s.ConfirmAcks(ctx, second); err == nil {
		t.Fatal("ConfirmAcks of the second after the channel closed: nil, want an error")
	}
	// An ack that the hand-back answers for (not sent: delivered again).
	third := s.AckMark()
	if err := ackE(ctx, nil); err != nil {
		t.Fatalf("ack of a delivery handed back: %v", err)
	}
	if err := s.ConfirmAcks(ctx, third); err == nil {
		t.Fatal("ConfirmAcks of an ack the hand-back answered for: nil, want an error")
	}
	if err := s.ConfirmAcks(ctx, s.AckMark()); err != nil {
		t.Fatalf("no ack since: %v", err)
	}
}
