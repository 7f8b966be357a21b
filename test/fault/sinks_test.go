//go:build fault

package fault

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// The collectors of the RabbitMQ and Kafka sinks (the NATS one is in
// harness_test.go).

// newRabbitCollector declares the durable queue the daemon publishes to
// (through the default exchange, the queue's name as routing key) and
// reads it with manual acks, reconnecting whenever the node went away. A
// copy is recorded when it is received: RabbitMQ stamps no time of its own,
// so a copy's time is its receive time.
//
// A message delivered to the collector but not yet acknowledged when the
// node stops comes again after the restart, flagged redelivered: that copy
// is the broker's, not the daemon's, and is not counted when a copy with the
// same attempt number was recorded already.
func newRabbitCollector(t *testing.T, node *testenv.RabbitNode, queue string) *collector {
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
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	conn.Close()

	c := newCollectorOf(t)
	var (
		mu          sync.Mutex
		markersSeen = map[string]bool{}
		markers     int
	)
	handle := func(d amqp.Delivery) {
		id := headerString(d.Headers, envelope.HeaderMessageID)
		if len(id) > len(markerPrefix) && id[:len(markerPrefix)] == markerPrefix {
			mu.Lock()
			markersSeen[id] = true
			mu.Unlock()
			return
		}
		cp := copyAt{at: time.Now()}
		cp.due, _ = time.Parse(time.RFC3339Nano, headerString(d.Headers, envelope.HeaderDueAt))
		cp.attempt, _ = strconv.Atoi(headerString(d.Headers, envelope.HeaderAttempt))
		if d.Redelivered {
			c.mu.Lock()
			again := false
			for _, o := range c.copies[id] {
				if o.attempt == cp.attempt {
					again = true
				}
			}
			if again {
				c.redelivered++
			}
			c.mu.Unlock()
			if again {
				return
			}
		}
		c.add(id, cp)
	}
	c.run = func(ctx context.Context) {
		for ctx.Err() == nil {
			conn, err := amqp.DialConfig(node.URL, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond): // re-try pacing while the node is away
				}
				continue
			}
			deliveries, err := consume(conn, queue)
			if err != nil {
				conn.Close()
				continue
			}
		read:
			for {
				select {
				case <-ctx.Done():
					break read
				case d, ok := <-deliveries:
					if !ok {
						break read
					}
					handle(d)
					_ = d.Ack(false)
				}
			}
			conn.Close()
		}
	}
	// caughtUp sends a marker through the queue and waits (up to 10 s) for
	// the reader to get it: the queue is first in, first out, so every
	// copy the queue held before it was read.
	c.caughtUp = func(ctx context.Context) bool {
		mu.Lock()
		markers++
		id := fmt.Sprintf("%s%d", markerPrefix, markers)
		mu.Unlock()
		conn, err := amqp.DialConfig(node.URL, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
		if err != nil {
			return false
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		if err := ch.Confirm(false); err != nil {
			return false
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		conf, err := ch.PublishWithDeferredConfirmWithContext(pctx, "", queue, true, false,
			amqp.Publishing{Headers: amqp.Table{envelope.HeaderMessageID: id}, DeliveryMode: amqp.Persistent})
		if err != nil {
			return false
		}
		if ok, err := conf.WaitContext(pctx); err != nil || !ok {
			return false
		}
		return testenv.Poll(10*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return markersSeen[id]
		})
	}
	return c
}

func consume(conn *amqp.Connection, queue string) (<-chan amqp.Delivery, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(500, 0, false); err != nil {
		return nil, err
	}
	return ch.Consume(queue, "fault-collector", false, false, false, false, nil)
}

func headerString(t amqp.Table, key string) string {
	v, ok := t[key]
	if !ok {
		return ""
	}
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	}
	return fmt.Sprint(v)
}

// The Kafka sink's topic.
const (
	sinkTopic      = "fired"
	sinkPartitions = 4
)

// newKafkaCollector reads every partition of the sink topic from its first
// offset, without a consumer group, each with a reader re-created at the
// next offset whenever it fails (the cluster closed). A copy's time is its
// record timestamp: the daemon's publish time (CreateTime).
func newKafkaCollector(t *testing.T, brokers []string) *collector {
	c := newCollectorOf(t)
	var (
		mu   sync.Mutex
		next = make([]int64, sinkPartitions)
	)
	readPartition := func(ctx context.Context, p int) {
		for ctx.Err() == nil {
			mu.Lock()
			from := next[p]
			mu.Unlock()
			r := kafka.NewReader(kafka.ReaderConfig{
				Brokers: brokers, Topic: sinkTopic, Partition: p,
				MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 250 * time.Millisecond,
				ReadBackoffMin: 100 * time.Millisecond, ReadBackoffMax: 500 * time.Millisecond,
				MaxAttempts: 1000,
			})
			if err := r.SetOffset(from); err != nil {
				r.Close()
				continue
			}
			for ctx.Err() == nil {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					break
				}
				mu.Lock()
				if m.Offset < next[p] {
					mu.Unlock()
					continue
				}
				next[p] = m.Offset + 1
				mu.Unlock()
				var id, due, attempt string
				for _, h := range m.Headers {
					switch h.Key {
					case envelope.HeaderMessageID:
						id = string(h.Value)
					case envelope.HeaderDueAt:
						due = string(h.Value)
					case envelope.HeaderAttempt:
						attempt = string(h.Value)
					}
				}
				cp := copyAt{at: m.Time, seq: uint64(m.Offset)}
				cp.due, _ = time.Parse(time.RFC3339Nano, due)
				cp.attempt, _ = strconv.Atoi(attempt)
				c.add(id, cp)
			}
			r.Close()
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond): // re-try pacing while the cluster is away
			}
		}
	}
	c.run = func(ctx context.Context) {
		var wg sync.WaitGroup
		for p := range sinkPartitions {
			wg.Go(func() { readPartition(ctx, p) })
		}
		wg.Wait()
	}
	c.caughtUp = func(ctx context.Context) bool {
		cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 3 * time.Second}
		reqs := make([]kafka.OffsetRequest, sinkPartitions)
		for p := range reqs {
			reqs[p] = kafka.LastOffsetOf(p)
		}
		res, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{sinkTopic: reqs}})
		if err != nil {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		for _, po := range res.Topics[sinkTopic] {
			if po.Error != nil || next[po.Partition] < po.LastOffset {
				return false
			}
		}
		return len(res.Topics[sinkTopic]) == sinkPartitions
	}
	return c
}
