package rabbitbroker_test

import (
	"context"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
)

// Probe answers while the sink's connection does, and says why not once
// the sink is closed.
func TestSinkProbe(t *testing.T) {
	node := testenv.RabbitMQ(t)
	s := newSink(t, rabbitbroker.SinkParams{URL: node.URL})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Probe(ctx); err != nil {
		t.Fatalf("Probe while connected: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Probe(ctx); err == nil {
		t.Fatal("Probe after Close: nil, want why not")
	}
}
