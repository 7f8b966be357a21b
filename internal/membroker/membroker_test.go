package membroker_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/ingesttest"
	"github.com/delaybridge/delaybridge/internal/membroker"
	"github.com/delaybridge/delaybridge/internal/sinktest"
	"github.com/delaybridge/delaybridge/pkg/brokers"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// The one line a new broker adds to the registry.
func init() { brokers.Register(membroker.Broker) }

// openSource opens an ingest of the queue through the registry, as the
// daemon opens any ingest.
func openSource(t *testing.T, queue string) ingest.Source {
	t.Helper()
	src, err := brokers.OpenSource(context.Background(), &config.Ingest{Name: "mem-in", Broker: &membroker.IngestConfig{Queue: queue}}, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func TestIngestConformance(t *testing.T) {
	ingesttest.Run(t, ingesttest.Harness{
		Open: openSource,
		Publish: func(t *testing.T, key string, m ingesttest.Message) {
			in := &config.Ingest{Name: "mem-in", Broker: &membroker.IngestConfig{Queue: key}}
			b := in.Broker.(brokers.Ingest)
			if _, err := b.Send(context.Background(), in, ingest.Publication{Headers: m.Headers, Body: m.Body, Key: m.Key}); err != nil {
				t.Fatal(err)
			}
		},
		SourceName: func(key string) string { return key },
		Features: ingesttest.Features{AtLeastOnce: true, Nack: true, AckIndividually: true, Ordered: true,
			PublishedAt: true, Keys: true, Origin: ingesttest.OriginLog, DuplicateHeaders: true, BinaryHeaders: true},
		Timeout: 10 * time.Second,
	})
}

func TestSinkConformance(t *testing.T) {
	sinktest.Run(t, sinktest.Harness{
		Open: func(t *testing.T) sinks.Sink {
			sk, err := brokers.OpenSink(context.Background(), &config.Sink{Name: "mem-out", Broker: &membroker.SinkConfig{}}, slog.Default())
			if err != nil {
				t.Fatal(err)
			}
			return sk
		},
		Destination: func(_ *testing.T, key string) string { return key },
		Consume: func(t *testing.T, dest string) <-chan sinktest.Received {
			src := openSource(t, dest)
			ctx, cancel := context.WithCancel(context.Background())
			out := make(chan sinktest.Received, 2000)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					in, ack, err := src.Read(ctx)
					if err != nil {
						return
					}
					out <- sinktest.Received{Headers: in.Headers, Body: in.Body, Key: in.Key}
					_ = ack(ctx, nil)
				}
			}()
			t.Cleanup(func() {
				cancel()
				<-done
				_ = src.Close(context.Background())
			})
			return out
		},
		Features: sinktest.Features{Confirms: true, Keys: true, Ordered: true, DuplicateHeaders: true, BinaryHeaders: true},
		Timeout:  10 * time.Second,
	})
}

// TestConfiguration: once registered, a mem: block is a known key of ingest
// and sink entries, validated by its folder, and its destinations are
// checked with its own reserved parts and the loop to its ingest.
func TestConfiguration(t *testing.T) {
	cfg, err := config.Parse([]byte(`
redis: {addr: "a:1"}
ingest:
  - name: in
    mem: {queue: delayed.in}
    route: {sink: out, destination: fired.x, allow_override: true, allowed_destinations: [">"]}
sinks:
  - name: out
    mem: {}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	refused := strings.Join(cfg.Refused(), "\n")
	for _, want := range []string{`sink out (memory queues)`, `beginning with "$mem."`, `"delayed.in" (ingest in reads it)`} {
		if !strings.Contains(refused, want) {
			t.Errorf("Refused() = %q, want it to say %q", refused, want)
		}
	}
	syn, ok := cfg.SinkDestinations("out")
	if !ok {
		t.Fatal("no destinations for sink out")
	}
	for dest, want := range map[string]bool{"fired.x": true, "$mem.x": false, "delayed.in": false} {
		if err := syn.Check(dest, []string{">"}, true); (err == nil) != want {
			t.Errorf("Check(%q) = %v, want allowed %v", dest, err, want)
		}
	}

	_, err = config.Parse([]byte(`
redis: {addr: "a:1"}
ingest:
  - name: in
    mem: {}
    dialects: [kafka-scheduler]
    route: {sink: out, destination: fired.x, allow_override: true}
sinks:
  - name: out
    mem: {}
`), nil)
	for _, want := range []string{"ingest[0].mem.queue (in): required", "kafka-scheduler reads Kafka records (key, tombstones): only on a kafka ingest, not mem"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse: %v, want it to say %q", err, want)
		}
	}
	if !slices.Contains(config.BrokerKinds(), membroker.Kind) {
		t.Errorf("BrokerKinds() = %v, want %q among them", config.BrokerKinds(), membroker.Kind)
	}
}
