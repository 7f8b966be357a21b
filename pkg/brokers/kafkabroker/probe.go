package kafkabroker

import (
	"context"
	"fmt"

	"github.com/delaybridge/delaybridge/pkg/sinks"
)

var _ sinks.Prober = (*Sink)(nil)

// Probe reports whether a broker of the cluster answers now, without
// publishing (Probe: a connection and the list of brokers), so that a
// topic whose produce requests time out (a partition without a leader) is
// told from a cluster that does not answer.
func (s *Sink) Probe(ctx context.Context) error {
	if err := Probe(ctx, s.dialer, s.cfg.Brokers); err != nil {
		return fmt.Errorf("kafka sink %s: probe: %w", s.cfg.Name, err)
	}
	return nil
}
