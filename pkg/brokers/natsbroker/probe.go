package natsbroker

import (
	"context"
	"fmt"

	"github.com/delaybridge/delaybridge/pkg/sinks"
)

var _ sinks.Prober = (*Sink)(nil)

// Probe reports whether the server answers now, without publishing. With
// JetStream it makes a JetStream API request (account info), so that a
// JetStream that does not answer (a server paused or overloaded, a cluster
// without its meta leader) is told from one subject whose PubAck never
// comes (its stream without a leader, or a subscriber that takes the
// publish and never answers): the scheduler asks it when a publish timed
// out and nothing else of the sink was confirmed while it waited. A user
// not allowed to make that request gets the server's refusal, which is an
// answer all the same. On core NATS it is a PING round trip.
func (s *Sink) Probe(ctx context.Context) error {
	if s.js == nil {
		if err := Flush(ctx, s.nc); err != nil {
			return fmt.Errorf("nats sink %s: probe: %w", s.cfg.Name, err)
		}
		return nil
	}
	from, _ := s.denied.mark()
	if _, err := s.js.AccountInfo(ctx); err != nil && s.denied.since(from, accountInfoAPI) == nil {
		return fmt.Errorf("nats sink %s: probe (JetStream account info): %w", s.cfg.Name, err)
	}
	return nil
}
