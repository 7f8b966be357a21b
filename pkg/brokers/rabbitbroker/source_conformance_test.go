package rabbitbroker_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/ingesttest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/ingest"
)

// conformancePrefetch is the Sources' prefetch (QoS): the default.
const conformancePrefetch = 1000

// TestConformance is not parallel: its BrokerRestart subtest stops the
// node that every test of this package shares.
func TestSourceConformance(t *testing.T) {
	node := testenv.RabbitMQ(t)
	pub := &confirmPublisher{url: node.URL}
	t.Cleanup(pub.close)
	ingesttest.Run(t, ingesttest.Harness{
		Open: func(t *testing.T, key string) ingest.Source {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// The queue is missing at the first Open: New declares it
			// (durable, classic), so it survives the broker restart.
			src, err := rabbitbroker.NewSource(ctx, rabbitbroker.SourceParams{
				Name: key, URL: node.URL, Queue: key, Prefetch: conformancePrefetch,
			}, quiet)
			if err != nil {
				t.Fatalf("rabbitbroker.New: %v", err)
			}
			return src
		},
		Publish: func(t *testing.T, key string, m ingesttest.Message) {
			t.Helper()
			p := amqp.Publishing{
				Headers:      amqp.Table{},
				Body:         m.Body,
				MessageId:    m.NativeID,
				DeliveryMode: amqp.Persistent,
			}
			for _, h := range m.Headers {
				p.Headers[h.Key] = h.Value // no duplicates: Features.DuplicateHeaders is false
			}
			var err error
			// Retried: after a broker restart the publisher connects again.
			ok := testenv.Poll(60*time.Second, func() bool {
				err = pub.publish(key, p)
				return err == nil
			})
			if !ok {
				t.Fatalf("publish to %s: %v", key, err)
			}
		},
		// Publish uses the default exchange: the routing key is the queue.
		SourceName: func(key string) string { return key },
		Features: ingesttest.Features{
			AtLeastOnce:     true,
			Nack:            true,
			Origin:          ingesttest.OriginPrint,
			AckIndividually: true,
			// One consumer of a classic queue: publish order when nothing
			// is requeued.
			Ordered: true,
			// The timestamp property has whole seconds: the delay counts
			// from the ingest (docs/reference.md), PublishedAt stays zero.
			NativeID:      "message_id",
			BinaryHeaders: true,
		},
		// The broker requeues what a closed channel held at once.
		RedeliveryDelay: time.Second,
		// Above the prefetch, so that the broker holds messages back.
		Backlog:     2 * conformancePrefetch,
		StopBroker:  func(t *testing.T) { node.Stop(t) },
		StartBroker: func(t *testing.T) { node.Start(t) },
	})
}

// confirmPublisher publishes like an application: persistent, mandatory,
// through the default exchange, one publisher confirm awaited per message.
// It reconnects when its connection is gone.
type confirmPublisher struct {
	url  string
	conn *amqp.Connection
	ch   *amqp.Channel
	ret  chan amqp.Return
}

func (c *confirmPublisher) close() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn, c.ch = nil, nil
	}
}

func (c *confirmPublisher) connect() error {
	conn, err := amqp.Dial(c.url)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return err
	}
	c.conn, c.ch = conn, ch
	c.ret = ch.NotifyReturn(make(chan amqp.Return, 1))
	return nil
}

func (c *confirmPublisher) publish(queue string, p amqp.Publishing) error {
	if c.ch == nil || c.ch.IsClosed() {
		c.close()
		if err := c.connect(); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, p)
	if err != nil {
		c.close()
		return err
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		c.close()
		return err
	}
	// A return comes before its confirm.
	select {
	case r := <-c.ret:
		return fmt.Errorf("returned: %d %s", r.ReplyCode, r.ReplyText)
	default:
	}
	if !acked {
		return errors.New("nacked by the broker")
	}
	return nil
}
