package rabbitbroker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// lockedBuffer is what a logger writes while the test reads it.
type lockedBuffer = testenv.Output

// replyTo is a routing key on the default exchange that names no live
// reply consumer: RabbitMQ closes the publishing connection (541
// INTERNAL_ERROR) when it reads its publish.
const replyTo = "amq.rabbitmq.reply-to.g1h2AA==.x"

// TestChannelCloseIsTheMessagesFault: a publish that the broker answers by
// closing the connection fails Rejected, that message's
// fault (an attempt), never as the sink being unavailable: the messages
// published with it, in its batch and in batches beside it, are confirmed
// and arrive, Ready never says the sink is down, and the next publishes
// to that routing key do not close the sink's connection again.
func TestChannelCloseIsTheMessagesFault(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	logs := &lockedBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := rabbitbroker.NewSink(ctx, rabbitbroker.SinkParams{Name: "r", URL: node.URL, Mandatory: true},
		slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })

	// Ready, sampled all along: the sink is never down.
	var notReady atomic.Value
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if err := s.Ready(); err != nil {
				notReady.CompareAndSwap(nil, err.Error())
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()

	want := map[string]bool{}
	round := func(r int) {
		t.Helper()
		// One batch with the bad key among good ones, and batches of good
		// ones beside it on the other channels.
		var mixed []sinks.Outgoing
		for i := range 20 {
			mixed = append(mixed, msg(fmt.Sprintf("r%d-m%d", r, i), q))
			if i == 10 {
				mixed = append(mixed, msg(fmt.Sprintf("r%d-bad", r), replyTo))
			}
		}
		var wg sync.WaitGroup
		beside := make([][]error, 3)
		for b := range beside {
			msgs := batch(fmt.Sprintf("r%d-b%d", r, b), q, 50)
			for _, m := range msgs {
				want[m.ID] = true
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				beside[b] = publish(t, s, msgs)
			}()
		}
		errs := publish(t, s, mixed)
		wg.Wait()
		for b, errs := range beside {
			for i, err := range errs {
				if err != nil {
					t.Errorf("round %d: message %d of the batch %d beside the bad one: %v", r, i, b, err)
				}
			}
		}
		for i, m := range mixed {
			err := errs[i]
			if m.Destination == replyTo {
				if !sinks.IsRejected(err) || sinks.IsPermanent(err) || !strings.Contains(err.Error(), "INTERNAL_ERROR") || !strings.Contains(err.Error(), replyTo) {
					t.Errorf("round %d: the message to %s: %v, want a Rejected error (an attempt) naming the key and 541 INTERNAL_ERROR", r, replyTo, err)
				}
				continue
			}
			want[m.ID] = true
			if err != nil {
				t.Errorf("round %d: message %s of the bad one's batch: %v", r, m.ID, err)
			}
		}
	}
	round(1)
	round(2) // its next attempt, published apart
	round(3)
	close(stop)
	<-sampled
	if v := notReady.Load(); v != nil {
		t.Errorf("Ready said the sink was down: %v", v)
	}

	// Every good message arrived (a message cut off by the close may arrive
	// twice: at least once).
	a.arrived(t, q, want, 10*time.Second)
	// The broker closed the sink's connection once: the next attempts went
	// to the quarantine only. (When the sink's write fails on the reset
	// socket before it reads the broker's close, it sees the connection
	// lost instead: TestConnectionLostWhilePublishing.)
	if n := strings.Count(logs.String(), "connection closed by the broker for a publish") +
		strings.Count(logs.String(), "connection lost; reconnecting at once"); n != 1 {
		t.Errorf("the sink's connection was closed %d times, want 1:\n%s", n, logs)
	}
	// The sink says what it does at DEBUG: each failed message is the
	// scheduler's to log at WARN, at most once per destination per
	// log.repeat_interval, and a WARN here per message would flood.
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "level=WARN") && (strings.Contains(l, replyTo) || strings.Contains(l, "for a publish")) {
			t.Errorf("the sink logged a failed message at WARN: %s", l)
		}
	}
	noErrors(t, publish(t, s, batch("after", q, 10)))
}

// A publish the broker answers by closing only its channel (406
// PRECONDITION_FAILED for an expiration that is not a number, a property
// kept from the ingest) is that message's fault too: the messages of its
// batch are confirmed, and the other channels never notice.
func TestChannelOnlyCloseIsTheMessagesFault(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true})
	msgs := batch("m", q, 20)
	bad := msg("bad-expiration", q)
	bad.Properties = envelope.Headers{{Key: rabbitbroker.PropExpiration, Value: "soon"}}
	msgs = append(msgs[:10], append([]sinks.Outgoing{bad}, msgs[10:]...)...)
	errs := publish(t, s, msgs)
	for i, m := range msgs {
		switch {
		case m.ID == bad.ID:
			if !sinks.IsRejected(errs[i]) || !strings.Contains(errs[i].Error(), "PRECONDITION_FAILED") {
				t.Errorf("the message with a bad expiration: %v, want Rejected with 406 PRECONDITION_FAILED", errs[i])
			}
		case errs[i] != nil:
			t.Errorf("message %s of its batch: %v", m.ID, errs[i])
		}
	}
	if err := s.Ready(); err != nil {
		t.Errorf("Ready: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return a.ready(q) >= 20 }, "the 20 good messages in %s", q)
	noErrors(t, publish(t, s, batch("after", q, 10)))
}

// TestConnectionLostWhilePublishing: the sink's connection reset under
// publishes in flight (a network blip, or the broker closing it for a
// publish while the sink still writes, its close unread) is reconnected
// at once: the publishes it cut off are published again apart and
// confirmed, none fails, and Ready never says the sink is down while the
// broker can be reached.
func TestConnectionLostWhilePublishing(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	p := testenv.NewProxy(t, fmt.Sprintf("127.0.0.1:%d", node.Port))
	logs := &lockedBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := rabbitbroker.NewSink(ctx, rabbitbroker.SinkParams{Name: "r", URL: "amqp://guest:guest@" + p.Addr + "/", Mandatory: true},
		slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })

	var notReady atomic.Value
	var confirmed atomic.Int64
	var confirmedIDs sync.Map
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// Three publishers, batch after batch, until stop: at any instant
	// some publishes are in flight.
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := 0; ; b++ {
				select {
				case <-stop:
					return
				default:
				}
				msgs := batch(fmt.Sprintf("g%d-b%d", g, b), q, 50)
				for i, err := range publish(t, s, msgs) {
					if err != nil {
						t.Errorf("%s: %v", msgs[i].ID, err)
					} else {
						confirmed.Add(1)
						confirmedIDs.Store(msgs[i].ID, true)
					}
				}
				if err := s.Ready(); err != nil {
					notReady.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	// Cut the connection three times, each once publishes are confirmed
	// again after the last.
	for range 3 {
		from := confirmed.Load()
		testenv.Eventually(t, 20*time.Second, func() bool { return confirmed.Load() >= from+200 }, "200 more publishes confirmed")
		p.Cut()
	}
	from := confirmed.Load()
	testenv.Eventually(t, 20*time.Second, func() bool { return confirmed.Load() >= from+200 }, "200 more publishes confirmed after the last cut")
	close(stop)
	wg.Wait()
	if v := notReady.Load(); v != nil {
		t.Errorf("Ready said the sink was down: %v", v)
	}
	if n := strings.Count(logs.String(), "connection lost; reconnecting at once"); n < 3 {
		t.Errorf("the sink saw its connection lost %d times, want 3 (the cuts):\n%s", n, logs)
	}
	// Every message confirmed arrived (a message cut off may arrive twice).
	want := map[string]bool{}
	confirmedIDs.Range(func(id, _ any) bool { want[id.(string)] = true; return true })
	a.arrived(t, q, want, 20*time.Second)
}

// More messages to a destination the broker closes the connection for
// than the quarantine can probe in one publish: the others of the batch
// are confirmed, and each bad one is its own fault (Rejected) or not
// decided yet (Again: published again later), never the sink's, which
// would hold every destination of the sink.
func TestManyMessagesToAClosingDestination(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true})
	var msgs []sinks.Outgoing
	for i := range 150 {
		if i%5 == 0 {
			msgs = append(msgs, msg(fmt.Sprintf("good-%d", i), q))
		} else {
			msgs = append(msgs, msg(fmt.Sprintf("bad-%d", i), replyTo))
		}
	}
	errs := publish(t, s, msgs)
	var rejected, again int
	for i, m := range msgs {
		err := errs[i]
		switch {
		case m.Destination == q && err != nil:
			t.Errorf("%s, to a good queue: %v", m.ID, err)
		case m.Destination == q:
		case sinks.IsRejected(err):
			rejected++
		case sinks.IsAgain(err):
			again++
		default:
			t.Errorf("%s, to %s: %v (unavailable: %v), want Rejected or Again", m.ID, replyTo, err, sinks.IsUnavailable(err))
		}
	}
	t.Logf("of %d to the closing destination: %d rejected, %d to publish again", 120, rejected, again)
	if err := s.Ready(); err != nil {
		t.Errorf("Ready: %v", err)
	}
}

// From the instant the scheduler's fence gives (sinks.WithSendBy) no
// message of a batch is sent: each says so, and the queue gets none.
func TestNothingSentPastTheSendBy(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := s.Publish(sinks.WithSendBy(ctx, time.Now().Add(-time.Millisecond)), batch("late", q, 5))
	for i, err := range errs {
		if !errors.Is(err, sinks.ErrSendBy) {
			t.Errorf("message %d: %v, want ErrSendBy", i, err)
		}
	}
	noErrors(t, publish(t, s, batch("after", q, 1)))
	if n := a.ready(q); n != 1 {
		t.Errorf("%d messages in the queue, want only the one sent after", n)
	}
}

// The reason a close names for delaybridge_sink_publish_errors_total:
// RabbitMQ closes the channel with 406 for a body over its
// max_message_size, and with 406 for other preconditions too.
func TestCloseReason(t *testing.T) {
	for _, c := range []struct {
		err  *amqp.Error
		want sinks.Reason
	}{
		{&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1024", Server: true}, sinks.ReasonTooLarge},
		{&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - invalid expiration 'soon'", Server: true}, sinks.ReasonRejected},
		{&amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED - write access to topic 'bad.1'", Server: true}, sinks.ReasonUnauthorized},
		{&amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no queue 'amq.rabbitmq.reply-to.x'", Server: true}, sinks.ReasonNotFound},
		{&amqp.Error{Code: amqp.InternalError, Reason: "INTERNAL_ERROR", Server: true}, sinks.ReasonRejected},
	} {
		if got := rabbitbroker.PublishCloseReason(fmt.Errorf("publish: %w", c.err)); got != c.want {
			t.Errorf("%s: %q, want %q", c.err.Reason, got, c.want)
		}
	}
}

// A message published again apart after its first publish lost its
// confirm keeps the mark of a copy that may have arrived, whatever the
// second try gave, unless it was confirmed.
func TestKeepSent(t *testing.T) {
	first := sinks.Sent(errors.New("no publisher confirm, the connection lost"))
	if err := rabbitbroker.KeepSent(first, nil); err != nil {
		t.Errorf("confirmed the second time: %v", err)
	}
	if err := rabbitbroker.KeepSent(first, errors.New("not sent: the time to begin sending it was over")); !sinks.IsSent(err) {
		t.Errorf("not sent the second time: %v, want it Sent still", err)
	}
	if err := rabbitbroker.KeepSent(errors.New("channel closed before sending"), errors.New("not sent")); sinks.IsSent(err) {
		t.Errorf("never sent: %v marked Sent", err)
	}
}

// A broker that takes the connection and never answers the handshake is
// one that does not answer (a sink waits for it), as amqp091-go words it;
// one that refuses the login is not.
func TestSilent(t *testing.T) {
	if !rabbitbroker.Silent(fmt.Errorf("connect: %w", &amqp.Error{Code: amqp.FrameError, Reason: "read tcp 127.0.0.1:40000->127.0.0.1:5800: i/o timeout"})) {
		t.Error("a handshake that timed out is not silent")
	}
	if rabbitbroker.Silent(&amqp.Error{Code: amqp.AccessRefused, Reason: "username or password not allowed"}) {
		t.Error("a refused login is silent")
	}
}
