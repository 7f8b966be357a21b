package rabbitbroker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// TestSinkAQueueThatTakesNothingHoldsNoOtherUp: a quorum queue that takes
// no publish (its process suspended here, as when it has lost its quorum)
// confirms nothing, and once enough publishes wait for it RabbitMQ stops
// reading the whole connection that sends them (flow control). The sink
// then takes the connection down and reconnects, so that another queue's
// publish goes through; Probe, on a connection of its own, still finds
// the broker answering (before, both timed out once the first batch had
// waited out its time); and a publish apart (the scheduler's, for a
// destination that stalled) puts each destination on a connection of its
// own, the healthy one's confirmed beside the stuck one's, whose
// connection, once it got no answer, sends nothing more until it does.
func TestSinkAQueueThatTakesNothingHoldsNoOtherUp(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	stuck, resume := suspendedQueue(t, node, a)
	healthy := a.queue(unique(t) + "-healthy")
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true})
	within := func(ctx context.Context, msgs []sinks.Outgoing) []error {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		return s.Publish(ctx, msgs)
	}

	// Enough publishes to the stuck queue for the broker to stop reading
	// the connection: each time out.
	first := within(context.Background(), batch("stuck", stuck, 2000))
	for i, err := range first {
		if err == nil {
			t.Fatalf("publish %d to a suspended queue confirmed", i)
		}
	}
	// Another queue's publish goes through, on the connection the sink
	// opened again.
	testenv.Eventually(t, 20*time.Second, func() bool {
		return within(context.Background(), []sinks.Outgoing{msg("alone", healthy)})[0] == nil
	}, "a publish to another queue confirmed after the stuck one's timed out")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if err := s.Probe(ctx); err != nil {
		t.Errorf("Probe: %v (the broker answers; only the queue takes nothing)", err)
	}
	cancel()

	// Apart: the healthy destination's messages are confirmed beside the
	// stuck one's, which time out.
	apart := append(batch("apart-stuck", stuck, 50), batch("apart-healthy", healthy, 50)...)
	errs := within(sinks.WithApart(context.Background()), apart)
	for i, err := range errs {
		if i < 50 && err == nil {
			t.Errorf("apart publish %d to the suspended queue confirmed", i)
		}
		if i >= 50 && err != nil {
			t.Errorf("apart publish %d to the healthy queue: %v", i, err)
		}
	}
	// And again: the healthy destination's are confirmed; the stuck one's
	// lane, which got no answer, sends nothing more until it does (one
	// batch of copies for the queue, not one per attempt), and its
	// messages fail as timeouts, which count for the destination.
	errs = within(sinks.WithApart(context.Background()), append(batch("again-stuck", stuck, 5), batch("again-healthy", healthy, 5)...))
	for i, err := range errs {
		switch {
		case i < 5 && (!errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "has taken no publish")):
			t.Errorf("second apart publish %d to the suspended queue: %v, want a timeout, not sent", i, err)
		case i >= 5 && err != nil:
			t.Errorf("second apart publish %d to the healthy queue: %v", i, err)
		}
	}
	lanes := strings.Count(node.Ctl(t, "list_connections", "client_properties"), "(apart: "+stuck+")")
	if lanes != 1 {
		t.Errorf("%d connections apart for the suspended queue, want 1 (kept, not dialed again)", lanes)
	}

	// Once the queue takes publishes again, what was sent on the lane
	// arrives, each once, and nothing of what was not sent.
	resume()
	counts := map[string]int{}
	read := func() int {
		for {
			d, ok, err := a.ch.Get(stuck, true)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return len(counts)
			}
			counts[d.MessageId]++
		}
	}
	testenv.Eventually(t, 60*time.Second, func() bool {
		read()
		for i := range 50 {
			if counts[fmt.Sprintf("apart-stuck-%d", i)] == 0 {
				return false
			}
		}
		return true
	}, "the messages sent on the suspended queue's lane arrive once it is resumed")
	read()
	for id, n := range counts {
		if strings.HasPrefix(id, "again-stuck") {
			t.Errorf("%s arrived: it was not sent", id)
		}
		if n > 1 {
			t.Errorf("%s arrived %d times, sent once", id, n)
		}
	}
}

// suspendedQueue declares a quorum queue and suspends its process, so
// that it takes no publish, as one without its quorum; resume lets it go
// on (once; the test's cleanup does it too).
func suspendedQueue(t *testing.T, node *testenv.RabbitNode, a *admin) (name string, resume func()) {
	name = unique(t) + "-stuck"
	if _, err := a.ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	pid := fmt.Sprintf(`{ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"%s">>)), P = amqqueue:get_pid(Q)`, name)
	node.Ctl(t, "eval", pid+`, sys:suspend(P), ok.`)
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			node.Ctl(t, "eval", pid+`, sys:resume(P), ok.`)
		}
	}
	t.Cleanup(resume)
	return name, resume
}

// TestSinkTheSharedLaneIsNotKeptForOne: past the destinations with a
// connection apart of their own, the others share one; when one of them
// takes nothing, that connection is closed, not kept waiting for it, so
// that the next publish of another destination on it goes through.
func TestSinkTheSharedLaneIsNotKeptForOne(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	stuck, _ := suspendedQueue(t, node, a)
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true})
	apart := func(msgs []sinks.Outgoing) []error {
		ctx, cancel := context.WithTimeout(sinks.WithApart(context.Background()), 3*time.Second)
		defer cancel()
		return s.Publish(ctx, msgs)
	}
	// Sixteen healthy destinations take the lanes of their own.
	var own []sinks.Outgoing
	for i := range rabbitbroker.MaxLanes {
		own = append(own, msg(fmt.Sprint("own-", i), a.queue(fmt.Sprintf("%s-%d", unique(t), i))))
	}
	for i, err := range apart(own) {
		if err != nil {
			t.Fatalf("apart publish to healthy queue %d: %v", i, err)
		}
	}
	// The stuck one and another share the last.
	other := a.queue(unique(t) + "-other")
	errs := apart([]sinks.Outgoing{msg("stuck-0", stuck)})
	if errs[0] == nil {
		t.Fatal("a publish to the suspended queue confirmed")
	}
	for try := range 2 {
		if err := apart([]sinks.Outgoing{msg(fmt.Sprint("other-", try), other)})[0]; err != nil {
			t.Errorf("publish %d to another queue on the shared connection apart: %v", try, err)
		}
	}
}
