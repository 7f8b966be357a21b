package kafkabroker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/sinktest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

func TestSinkConformance(t *testing.T) {
	k := testenv.Kafka(t) // auto topic creation off: an unknown topic is refused
	var unknown atomic.Int64
	sinktest.Run(t, sinktest.Harness{
		Open: func(t *testing.T) sinks.Sink {
			t.Helper()
			s, err := NewSink(withSinkDefaults(SinkParams{Name: "conformance", Brokers: k.Brokers}), slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return s
		},
		Destination: func(t *testing.T, key string) string {
			t.Helper()
			k.CreateTopic(t, key, conformancePartitions)
			return key
		},
		Consume: func(t *testing.T, topic string) <-chan sinktest.Received {
			t.Helper()
			return consumeTopic(t, k, topic)
		},
		UnroutableDestination: func(*testing.T) string {
			return "no-such-topic-" + strconv.FormatInt(unknown.Add(1), 10)
		},
		Features: sinktest.Features{
			Confirms:         true,
			Keys:             true,
			Ordered:          true,
			DuplicateHeaders: true,
			BinaryHeaders:    true,
			// MaxMessageBytes bounds the whole record (headers and framing
			// included), as Kafka's default max.message.bytes does.
			MaxBody:      DefaultMaxMessageBytes - 4096,
			OversizeBody: DefaultMaxMessageBytes + 1,
		},
		StopBroker:  func(*testing.T) { k.Close() },
		StartBroker: func(*testing.T) { k.Restart() },
	})
}

// consumeTopic reads every partition of topic from its first offset, as a
// consumer of the destination would, until the test ends.
func consumeTopic(t *testing.T, k *testenv.KafkaCluster, topic string) <-chan sinktest.Received {
	ch := make(chan sinktest.Received, 10000)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	lastErr := make([]string, conformancePartitions) // per partition, each goroutine its own
	readers := make([]*kafka.Reader, conformancePartitions)
	for p := range conformancePartitions {
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers:   k.Brokers,
			Topic:     topic,
			Partition: p,
			// kafka-go gives a fetch's answer MaxWait to begin: 100 ms
			// was too little for the Body case's 1 MiB record on a loaded
			// machine (each try timed out, none progressed). 1 s, as the
			// ingest reads.
			MaxWait:  time.Second,
			MaxBytes: 4 << 20,
		})
		readers[p] = r
		wg.Go(func() {
			defer r.Close()
			for {
				m, err := r.FetchMessage(ctx)
				if errors.Is(err, context.Canceled) || ctx.Err() != nil {
					return
				}
				if err != nil { // not expected: the reader retries by itself
					if last := lastErr[p]; last != err.Error() {
						lastErr[p] = err.Error()
						t.Logf("kafka reader of %s partition %d: %v", topic, p, err) // says why a message that never arrives did not
					}
					select {
					case <-ctx.Done():
						return
					case <-time.After(50 * time.Millisecond): // pacing
					}
					continue
				}
				rec := sinktest.Received{Body: m.Value, Key: m.Key}
				for _, h := range m.Headers {
					rec.Headers = append(rec.Headers, envelope.Header{Key: h.Key, Value: string(h.Value)})
				}
				select {
				case ch <- rec:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	t.Cleanup(func() {
		if t.Failed() { // where each reader was: a message not read, or not there
			for p, r := range readers {
				st := r.Stats()
				last, err := lastOffset(k.Brokers[0], topic, p)
				t.Logf("kafka reader of %s partition %d: at offset %d of %d (%v), %d messages, %d fetches, %d errors, %d timeouts",
					topic, p, st.Offset, last, err, st.Messages, st.Fetches, st.Errors, st.Timeouts)
			}
		}
		cancel()
		wg.Wait()
	})
	return ch
}

// lastOffset is the offset the next record of the partition will get.
func lastOffset(broker, topic string, partition int) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := kafka.DialLeader(ctx, "tcp", broker, topic, partition)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.ReadLastOffset()
}
