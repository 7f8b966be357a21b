package kafkabroker

import (
	"context"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// Probe answers while a broker of the cluster does, and says why not once
// none does.
func TestSinkProbe(t *testing.T) {
	k := testenv.Kafka(t)
	s := newSink(t, k, SinkParams{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Probe(ctx); err != nil {
		t.Fatalf("Probe with the cluster up: %v", err)
	}
	k.Close()
	if err := s.Probe(ctx); err == nil {
		t.Fatal("Probe with the cluster closed: nil, want why not")
	}
}
