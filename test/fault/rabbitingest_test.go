//go:build fault

package fault

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// The RabbitMQ ingest (options.rabbitIn): a durable classic queue of the
// scenario's own on the test binary's RabbitMQ node, fed through the default
// exchange with publisher confirms.

// newRabbitPublisher (re)creates the durable queue the daemons consume and
// publishes to it one message at a time, waiting for the broker's confirm (a
// message counts as sent when it is confirmed). The messages are transient:
// no scenario restarts the node under the ingest queue, and a persistent
// message is confirmed only once it is on disk, which here makes a confirm
// take about 5 ms, too slow for the suite's 300 msg/s and its bursts. x-delay is
// an AMQP integer, as publishers of RabbitMQ's delayed-message exchange send
// it. A publish that fails is retried on a new connection (publisher.publish
// paces the retries); a resend after a lost confirm is a second copy in the
// queue, which the daemon parks as a no-op (same x-message-id) unless the
// first copy was already delivered.
func newRabbitPublisher(t *testing.T, name string, node *testenv.RabbitNode, queue string) *publisher {
	t.Helper()
	conn, err := amqp.Dial(node.URL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	// The arguments the daemon declares a missing queue with (durable,
	// classic): it finds this one and uses it as it is.
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic}); err != nil {
		t.Fatal(err)
	}
	conn.Close()

	var (
		mu  sync.Mutex
		pc  *amqp.Connection
		pch *amqp.Channel
	)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if pc != nil {
			pc.Close()
		}
	})
	channel := func() (*amqp.Channel, error) {
		if pch != nil && !pch.IsClosed() {
			return pch, nil
		}
		if pc != nil {
			pc.Close()
		}
		c, err := amqp.DialConfig(node.URL, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
		if err != nil {
			return nil, err
		}
		ch, err := c.Channel()
		if err == nil {
			err = ch.Confirm(false)
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		pc, pch = c, ch
		return ch, nil
	}
	p := newPublisher(t, name)
	p.send = func(ctx context.Context, id string, delay time.Duration, at time.Time) error {
		mu.Lock()
		defer mu.Unlock()
		ch, err := channel()
		if err != nil {
			return err
		}
		h := amqp.Table{envelope.HeaderMessageID: id, envelope.HeaderDelay: int32(delay.Milliseconds())}
		if !at.IsZero() {
			delete(h, envelope.HeaderDelay)
			h[envelope.HeaderDeliverAt] = strconv.FormatInt(at.UnixMilli(), 10)
		}
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false,
			amqp.Publishing{Headers: h, Body: []byte(id), DeliveryMode: amqp.Transient})
		if err != nil {
			pch = nil
			return err
		}
		ok, err := conf.WaitContext(ctx)
		if err != nil {
			pch = nil
			return err
		}
		if !ok {
			return fmt.Errorf("rabbitmq nacked the publish of %s", id)
		}
		return nil
	}
	return p
}

// queueDepth returns the ingest queue's messages ready (waiting for a
// consumer) and delivered but not acknowledged, from rabbitmqctl (about a
// second per call: Erlang starts a VM for it).
func (w *world) queueDepth() (ready, unacked int, err error) {
	out := w.rabbitIn.Ctl(w.t, "list_queues", "-q", "--no-table-headers", "name", "messages_ready", "messages_unacknowledged")
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == w.inQueue {
			ready, err = strconv.Atoi(f[1])
			if err == nil {
				unacked, err = strconv.Atoi(f[2])
			}
			return ready, unacked, err
		}
	}
	return 0, 0, fmt.Errorf("queue %s not in rabbitmqctl list_queues:\n%s", w.inQueue, out)
}
