package kafkabroker

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/ingesttest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/ingest"
)

// conformancePartitions is the partition count of every topic of the suite:
// more than one, so that records of different keys interleave as they do in
// production; the suite gives messages whose order matters one key.
const conformancePartitions = 3

// conformanceMaxMessageBytes is the topics' max.message.bytes: room for the
// suite's 1 MiB body (the contract's default limits.max_payload_bytes) with
// its headers and record framing. Kafka's default (1048588) leaves only 12
// bytes for them, so a deployment taking 1 MiB bodies raises it the same way.
const conformanceMaxMessageBytes = 2 << 20

// sessionTimeout is the consumer group session timeout of the suite's
// Sources: short, so that a member that vanished with the brokers (the
// BrokerRestart subtest) is replaced quickly.
const sessionTimeout = 2 * time.Second

func TestSourceConformance(t *testing.T) {
	k := testenv.Kafka(t)
	var (
		mu      sync.Mutex
		created = map[string]bool{}
	)
	// One writer for the whole run, as an application has; kafka-go's
	// Writer reconnects by itself after the brokers restart.
	w := &kafka.Writer{
		Addr:         kafka.TCP(k.Brokers...),
		Balancer:     kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
		BatchBytes:   conformanceMaxMessageBytes,
		MaxAttempts:  3,
		Transport:    &kafka.Transport{MetadataTTL: time.Second},
	}
	t.Cleanup(func() { _ = w.Close() })

	ingesttest.Run(t, ingesttest.Harness{
		Open: func(t *testing.T, key string) ingest.Source {
			t.Helper()
			mu.Lock()
			if !created[key] {
				if err := k.Cluster.CreateTopic(key, conformancePartitions,
					map[string]string{"max.message.bytes": strconv.Itoa(conformanceMaxMessageBytes)}); err != nil {
					mu.Unlock()
					t.Fatalf("create topic %s: %v", key, err)
				}
				created[key] = true
			}
			mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			src, err := NewSource(ctx, withDefaults(SourceParams{
				Name:           key,
				Brokers:        k.Brokers,
				Topic:          key,
				Group:          "delaybridge",
				SessionTimeout: sessionTimeout,
			}), testLog(t))
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return src
		},
		Publish: func(t *testing.T, key string, m ingesttest.Message) {
			t.Helper()
			msg := kafka.Message{Topic: key, Key: m.Key, Value: m.Body}
			for _, h := range m.Headers {
				msg.Headers = append(msg.Headers, kafka.Header{Key: h.Key, Value: []byte(h.Value)})
			}
			var err error
			// Retried: right after a broker restart the writer's
			// connections and metadata are stale.
			ok := testenv.Poll(30*time.Second, func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				err = w.WriteMessages(ctx, msg)
				return err == nil
			})
			if !ok {
				t.Fatalf("produce to %s: %v", key, err)
			}
		},
		SourceName: func(key string) string { return key }, // the topic
		Features: ingesttest.Features{
			AtLeastOnce: true,
			// the Kafka Source re-reads the partition of a nacked record from
			// its lowest unfinished offset after a short pause: the record
			// comes back to the same open Source (later ones too, which
			// AckIndividually false allows).
			Nack:             true,
			Ordered:          true,
			PublishedAt:      true,
			Keys:             true,
			Origin:           ingesttest.OriginLog,
			DuplicateHeaders: true,
			BinaryHeaders:    true,
			Tombstones:       true,
		},
		// A reopen joins the group again; the closed member left it, so
		// the rebalance is quick. Bounded by the session timeout when it
		// did not (BrokerRestart: the group is gone with the brokers).
		RedeliveryDelay: 2 * sessionTimeout,
		// Above MaxInFlightPerPartition (1000): the Backlog subtest's
		// records share one key, hence one partition, so fetching must
		// pause at the cap and resume.
		Backlog:     2500,
		StopBroker:  func(*testing.T) { k.Close() },
		StartBroker: func(*testing.T) { k.Restart() },
	})
}
