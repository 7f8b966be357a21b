package rabbitbroker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

func newSink(t testing.TB, cfg rabbitbroker.SinkParams) *rabbitbroker.Sink {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := rabbitbroker.NewSink(ctx, cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func msg(id, dest string) sinks.Outgoing {
	return sinks.Outgoing{
		Message: &envelope.Message{
			ID:          id,
			DueAt:       time.Date(2026, 5, 6, 7, 8, 9, 123e6, time.UTC),
			Sink:        "rabbit",
			Destination: dest,
			Headers:     envelope.Headers{{Key: "x-custom", Value: "c"}, {Key: "x-delay", Value: "5000"}},
			Body:        []byte("body of " + id),
		},
		Attempt: 1,
	}
}

func batch(prefix, dest string, n int) []sinks.Outgoing {
	msgs := make([]sinks.Outgoing, n)
	for i := range msgs {
		msgs[i] = msg(fmt.Sprintf("%s-%d", prefix, i), dest)
	}
	return msgs
}

func publish(t testing.TB, s sinks.Sink, msgs []sinks.Outgoing) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := s.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d errors for %d messages", len(errs), len(msgs))
	}
	return errs
}

func noErrors(t testing.TB, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
}

func TestSinkPublishArrives(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true})
	m := msg("id-1", q)
	m.Attempt = 3
	m.Body = []byte("bin\x00\xff")
	noErrors(t, publish(t, s, []sinks.Outgoing{m}))
	d := a.get(q)
	if string(d.Body) != "bin\x00\xff" || d.MessageId != "id-1" || d.DeliveryMode != amqp.Persistent {
		t.Errorf("body %q message_id %q delivery mode %d", d.Body, d.MessageId, d.DeliveryMode)
	}
	want := amqp.Table{
		"x-custom":              "c",
		"x-message-id":          "id-1",
		"x-delaybridge-due-at":  "2026-05-06T07:08:09.123Z",
		"x-delaybridge-attempt": "3",
	}
	if fmt.Sprint(d.Headers) != fmt.Sprint(want) {
		t.Errorf("headers %v, want %v (x-delay must not be forwarded)", d.Headers, want)
	}
	if err := s.Ready(); err != nil {
		t.Errorf("Ready: %v", err)
	}
}

func TestSinkManyInFlight(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL})
	const n = 10000 // more than one channel's in-flight cap
	start := time.Now()
	noErrors(t, publish(t, s, batch("m", q, n)))
	t.Logf("%d confirmed in one batch in %v (%.0f msg/s)", n, time.Since(start), n/time.Since(start).Seconds())
	if got := a.ready(q); got != n {
		t.Errorf("queue has %d, want %d", got, n)
	}
}

// Unroutable mandatory publishes fail with "unroutable" while the routable
// ones of the same batch succeed, on the default exchange and on a named one.
func TestSinkUnroutable(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	ex := unique(t) + "-ex"
	if err := a.ch.ExchangeDeclare(ex, amqp.ExchangeDirect, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.ch.QueueBind(q, "bound", ex, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ exchange, good, bad string }{{"", q, q + "-nowhere"}, {ex, "bound", "unbound"}} {
		s := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Exchange: c.exchange, Mandatory: true})
		var msgs []sinks.Outgoing
		for i := range 200 {
			dest := c.good
			if i%3 == 0 {
				dest = c.bad
			}
			// Same IDs for good and bad: correlation must not mix them up.
			msgs = append(msgs, msg(fmt.Sprint("u", i/2), dest))
		}
		errs := publish(t, s, msgs)
		good := 0
		for i, err := range errs {
			if msgs[i].Destination == c.bad {
				if err == nil || !strings.Contains(err.Error(), "unroutable") || !errors.Is(err, rabbitbroker.ErrUnroutable) {
					t.Errorf("exchange %q: unroutable message %d: %v", c.exchange, i, err)
				}
				if sinks.IsPermanent(err) {
					t.Errorf("unroutable is retried, not permanent: %v", err)
				}
			} else {
				good++
				if err != nil {
					t.Errorf("exchange %q: routable message %d: %v", c.exchange, i, err)
				}
			}
		}
		testenv.Eventually(t, 10*time.Second, func() bool { return a.ready(q) == good }, "%d routed", good)
		if _, err := a.ch.QueuePurge(q, false); err != nil {
			t.Fatal(err)
		}
	}
	// Without Mandatory an unroutable message is dropped by the broker and
	// counts as published.
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL})
	noErrors(t, publish(t, s, []sinks.Outgoing{msg("x", q+"-nowhere")}))
}

// A missing exchange closes the channel (404): a clear error, the sink is
// not ready (naming the exchange: its messages are held, not tried), and
// the channel is reopened so that publishing works once the exchange
// exists, when the sink is ready again by itself.
func TestSinkMissingExchange(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	ex := unique(t) + "-ex"
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Exchange: ex, Mandatory: true})
	for range 3 {
		for i, err := range publish(t, s, batch("e", q, 10)) {
			if err == nil || !strings.Contains(err.Error(), "not found") || !strings.Contains(err.Error(), ex) {
				t.Fatalf("message %d to a missing exchange: %v", i, err)
			}
		}
	}
	if err := s.Ready(); err == nil || !strings.Contains(err.Error(), ex) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Ready with a missing exchange: %v, want not ready naming the exchange", err)
	}
	if err := a.ch.ExchangeDeclare(ex, amqp.ExchangeDirect, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, func() bool { return s.Ready() == nil }, "the sink not ready again once its exchange exists")
	if err := a.ch.QueueBind(q, q, ex, false, nil); err != nil {
		t.Fatal(err)
	}
	// The channels are reopened in the background.
	testenv.Eventually(t, 10*time.Second, func() bool {
		return publish(t, s, []sinks.Outgoing{msg("after", q)})[0] == nil
	}, "publish after the exchange was declared")
	for range 8 { // every channel of the pool works again
		noErrors(t, publish(t, s, batch("ok", q, 5)))
	}
}

// A connection the broker blocked (a resource alarm: it reads nothing more
// from it) is not sent to: a publish is refused at once as not sent, and
// the sink is not ready, until the broker unblocks it. (The broker's
// notification is given by hand here: a real alarm would block every
// test on the shared node.)
func TestSinkBlockedSendsNothing(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL})
	s.Block(true, "memory")
	for i, err := range publish(t, s, batch("b", q, 5)) {
		if err == nil || !strings.Contains(err.Error(), "not sent") || !strings.Contains(err.Error(), "memory") || sinks.IsSent(err) {
			t.Fatalf("message %d while blocked: %v, want not sent, saying why", i, err)
		}
	}
	if err := s.Ready(); err == nil || !strings.Contains(err.Error(), "blocks publishing") {
		t.Errorf("Ready while blocked: %v", err)
	}
	if n := a.ready(q); n != 0 {
		t.Fatalf("%d messages reached the queue while the connection was blocked", n)
	}
	s.Block(false, "")
	noErrors(t, publish(t, s, batch("u", q, 5)))
	if s.Ready() != nil {
		t.Errorf("Ready once unblocked: %v", s.Ready())
	}
}

func TestSinkPermanentErrors(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL})
	long := msg("long-key", strings.Repeat("k", 256))
	badHeader := msg("bad-header", q)
	badHeader.Headers = envelope.Headers{{Key: strings.Repeat("h", 256), Value: "v"}}
	longID := msg(strings.Repeat("i", 300), q)
	errs := publish(t, s, []sinks.Outgoing{long, badHeader, longID, msg("fine", q)})
	if !sinks.IsPermanent(errs[0]) || !sinks.IsPermanent(errs[1]) {
		t.Errorf("over-long routing key / header name: %v / %v, want permanent errors", errs[0], errs[1])
	}
	if errs[2] != nil || errs[3] != nil {
		t.Fatalf("long ID / fine: %v / %v", errs[2], errs[3])
	}
	d := a.get(q)
	if d.MessageId != "" || d.Headers["x-message-id"] != longID.ID {
		t.Errorf("an ID over 255 bytes travels in x-message-id only: message_id %q", d.MessageId)
	}
}

func TestSinkConcurrentPublish(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true})
	const workers, batches, size = 8, 20, 100
	var wg sync.WaitGroup
	var failed atomic.Int64
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				for _, err := range s.Publish(context.Background(), batch(fmt.Sprintf("w%d-b%d", w, b), q, size)) {
					if err != nil {
						failed.Add(1)
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	n := workers * batches * size
	t.Logf("%d confirmed from %d goroutines in %v (%.0f msg/s)", n, workers, time.Since(start), float64(n)/time.Since(start).Seconds())
	if failed.Load() == 0 {
		if got := a.ready(q); got != n {
			t.Errorf("queue has %d, want %d", got, n)
		}
	}
}

func TestSinkPublishContextEnds(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, err := range s.Publish(ctx, batch("c", q, 10)) {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("publish with an ended context: %v", err)
		}
	}
	noErrors(t, publish(t, s, batch("after", q, 10)))
}

// The broker restarts: publishes fail (never hang, never succeed without a
// confirm), Ready reports the outage, and publishing recovers. Not
// parallel: it stops the shared node.
func TestSinkBrokerRestart(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true})

	var (
		stop      = make(chan struct{})
		done      = make(chan struct{})
		confirmed sync.Map
		oks, errs atomic.Int64
		sawErr    = make(chan struct{})
		sawOnce   sync.Once
	)
	go func() {
		defer close(done)
		for b := 0; ; b++ {
			select {
			case <-stop:
				return
			default:
			}
			msgs := batch(fmt.Sprint("b", b), q, 50)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			res := s.Publish(ctx, msgs)
			cancel()
			if res[0] != nil && res[len(res)-1] != nil {
				// Pace the retries during the outage, as the scheduler does.
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
			for i, err := range res {
				if err == nil {
					oks.Add(1)
					confirmed.Store(msgs[i].ID, true)
				} else {
					errs.Add(1)
					sawOnce.Do(func() { close(sawErr) })
				}
			}
		}
	}()
	testenv.Eventually(t, 10*time.Second, func() bool { return oks.Load() > 500 }, "publishing before the restart")
	node.Stop(t)
	<-sawErr
	testenv.Eventually(t, 10*time.Second, func() bool { return s.Ready() != nil }, "Ready reports the outage")
	t.Logf("during the outage: %v", s.Ready())
	node.Start(t)
	testenv.Eventually(t, 60*time.Second, func() bool { return s.Ready() == nil }, "reconnected")
	before := oks.Load()
	testenv.Eventually(t, 30*time.Second, func() bool { return oks.Load() > before+500 }, "publishing after the restart")
	close(stop)
	<-done
	t.Logf("confirmed %d, failed %d", oks.Load(), errs.Load())

	// Every confirmed message is in the (durable) queue: drain it and check.
	a = newAdmin(t, node.URL)
	inQueue := map[string]bool{}
	for a.ready(q) > 0 {
		d, ok, err := a.ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			inQueue[d.MessageId] = true
		}
	}
	missing := 0
	confirmed.Range(func(k, _ any) bool {
		if !inQueue[k.(string)] {
			missing++
		}
		return true
	})
	if missing > 0 {
		t.Errorf("%d confirmed messages are not in the queue", missing)
	}
}

func BenchmarkPublish(b *testing.B) {
	node := testenv.RabbitMQ(b)
	a := newAdmin(b, node.URL)
	for _, bc := range []struct {
		name      string
		queueType string
		size      int
		workers   int
	}{
		{"classic/batch=1000/workers=1", amqp.QueueTypeClassic, 1000, 1},
		{"classic/batch=256/workers=4", amqp.QueueTypeClassic, 256, 4},
		{"quorum/batch=1000/workers=1", amqp.QueueTypeQuorum, 1000, 1},
		{"quorum/batch=256/workers=4", amqp.QueueTypeQuorum, 256, 4},
	} {
		b.Run(bc.name, func(b *testing.B) {
			q := unique(b)
			if _, err := a.ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: bc.queueType}); err != nil {
				b.Fatal(err)
			}
			defer a.ch.QueueDelete(q, false, false, false)
			s := newSink(b, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true})
			msgs := batch("bench", q, bc.size)
			for i := range msgs {
				msgs[i].Body = make([]byte, 256)
			}
			b.ResetTimer()
			var next atomic.Int64
			var wg sync.WaitGroup
			for range bc.workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(int64(bc.size)) <= int64(b.N)+int64(bc.size)-1 {
						for _, err := range s.Publish(context.Background(), msgs) {
							if err != nil {
								b.Error(err)
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			published := (int64(b.N) + int64(bc.size) - 1) / int64(bc.size) * int64(bc.size)
			b.ReportMetric(float64(published)/b.Elapsed().Seconds(), "msg/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// TestSinkAQueueThatRefusesIsItsDestinationsFault: a queue at its
// x-max-length with x-overflow reject-publish makes the broker nack the
// publish. That is the queue's refusal of the message, an attempt of it,
// not the sink being unavailable, which held every destination of the
// sink behind the full queue and never counted an attempt.
func TestSinkAQueueThatRefusesIsItsDestinationsFault(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	full := unique(t) + "-full"
	if _, err := a.ch.QueueDeclare(full, false, true, false, false, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	other := a.queue(unique(t))
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true})
	errs := publish(t, s, []sinks.Outgoing{msg("a", full), msg("b", full), msg("c", other)})
	if errs[0] != nil {
		t.Errorf("the first message to the queue with room: %v", errs[0])
	}
	if err := errs[1]; !sinks.IsRejected(err) || sinks.IsUnavailable(err) || sinks.ReasonOf(err) != sinks.ReasonRejected ||
		!errors.Is(err, rabbitbroker.ErrNacked) || !strings.Contains(err.Error(), "reject-publish") {
		t.Errorf("a message to the full queue: %v (rejected %v, unavailable %v, reason %q); want rejected, naming what to change",
			err, sinks.IsRejected(err), sinks.IsUnavailable(err), sinks.ReasonOf(err))
	}
	if errs[2] != nil {
		t.Errorf("a message to another queue, in the same batch: %v", errs[2])
	}
	if err := s.Ready(); err != nil {
		t.Errorf("Ready: %v", err)
	}
}

// TestSinkANackAmongAcksIsNotTakenForAnAck: RabbitMQ nacks a publish a
// reject-publish queue refuses at once, while a durable queue's acks come
// later, several in one multiple ack. amqp091-go's NotifyPublish reported
// such a nack as an ack when the multiple ack covered it: the message was
// taken for delivered and deleted, lost (the probe: 100-123 of 200 to a
// full queue beside traffic to another). Each publish is settled with the
// library's own confirmation of it, which has the nack.
func TestSinkANackAmongAcksIsNotTakenForAnAck(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	refusing := unique(t) + "-refusing"
	if _, err := a.ch.QueueDeclare(refusing, false, true, false, false, amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	durable := unique(t) + "-durable"
	if _, err := a.ch.QueueDeclare(durable, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = a.ch.QueueDelete(durable, false, false, false) })
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true})
	var msgs []sinks.Outgoing
	for i := range 2000 {
		dest := durable
		if i%10 == 3 {
			dest = refusing
		}
		msgs = append(msgs, msg(fmt.Sprint("n", i), dest))
	}
	errs := publish(t, s, msgs)
	taken, good := 0, 0
	for i, err := range errs {
		if msgs[i].Destination == refusing {
			if err == nil {
				taken++
			} else if !errors.Is(err, rabbitbroker.ErrNacked) || !sinks.IsRejected(err) {
				t.Errorf("message %d to the refusing queue: %v, want a nack", i, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("message %d to the durable queue: %v", i, err)
			continue
		}
		good++
	}
	if taken > 0 {
		t.Errorf("%d of 200 messages the refusing queue nacked were taken for delivered", taken)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return a.ready(durable) == good }, "%d in the durable queue", good)
}
