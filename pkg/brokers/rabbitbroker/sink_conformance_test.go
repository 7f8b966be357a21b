package rabbitbroker_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/sinktest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// TestConformance is not parallel: its BrokerRestart subtest stops the
// node that every test of this package shares.
func TestSinkConformance(t *testing.T) {
	node := testenv.RabbitMQ(t)
	var unrouted atomic.Int64
	sinktest.Run(t, sinktest.Harness{
		Open: func(t *testing.T) sinks.Sink {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// The default exchange: the destination is a queue name.
			s, err := rabbitbroker.NewSink(ctx, rabbitbroker.SinkParams{Name: "conformance", URL: node.URL, Mandatory: true}, quiet)
			if err != nil {
				t.Fatalf("rabbitbroker.New: %v", err)
			}
			return s
		},
		Destination: func(t *testing.T, key string) string {
			t.Helper()
			// Durable, so that a message published just before the broker
			// stops is still there after it started again.
			ch := dialChannel(t, node.URL)
			if _, err := ch.QueueDeclare(key, true, false, false, false, nil); err != nil {
				t.Fatalf("declare queue %s: %v", key, err)
			}
			return key
		},
		Consume: func(t *testing.T, queue string) <-chan sinktest.Received {
			t.Helper()
			ch := dialChannel(t, node.URL)
			ds, err := ch.Consume(queue, "", true, true, false, false, nil)
			if err != nil {
				t.Fatalf("consume %s: %v", queue, err)
			}
			out := make(chan sinktest.Received, 10000)
			go func() {
				for d := range ds { // ends when the connection closes
					out <- received(d)
				}
			}()
			return out
		},
		UnroutableDestination: func(*testing.T) string {
			return "nowhere-" + strconv.FormatInt(unrouted.Add(1), 10) // no queue of that name
		},
		Features: sinktest.Features{
			Confirms: true,
			BrokerID: true, // message_id
			// One queue, one consumer: publish order.
			Ordered:       true,
			BinaryHeaders: true,
			// RabbitMQ's max_message_size (128 MiB by default) is far
			// above the suite's 1 MiB: no OversizeBody.
		},
		StopBroker:  func(t *testing.T) { node.Stop(t) },
		StartBroker: func(t *testing.T) { node.Start(t) },
	})
}

// dialChannel opens a connection of its own (closed when the test ends)
// and a channel on it.
func dialChannel(t *testing.T, url string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	return ch
}

// received converts a delivery as a consumer sees it: the headers table
// (sorted by key; a table has no order) and the message_id property.
func received(d amqp.Delivery) sinktest.Received {
	r := sinktest.Received{Body: d.Body, BrokerID: d.MessageId}
	keys := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var v string
		switch x := d.Headers[k].(type) {
		case string:
			v = x
		case []byte:
			v = string(x)
		default:
			v = fmt.Sprint(x) // not what the sink sends: shows in the diff
		}
		r.Headers = append(r.Headers, envelope.Header{Key: k, Value: v})
	}
	return r
}
