package rabbitbroker

import (
	"context"
	"fmt"

	"github.com/delaybridge/delaybridge/pkg/sinks"
)

var _ sinks.Prober = (*Sink)(nil)

// Probe reports whether the broker answers now, without publishing: a
// channel opened and closed on the sink's connection, two round trips the
// broker answers whatever a queue does. So a publish whose confirm never
// comes (a quorum queue without its quorum) is told from a broker that
// does not answer. A connection the broker blocked (a resource alarm) takes
// no publish: that is the sink's, and Probe says so.
func (s *Sink) Probe(ctx context.Context) error {
	s.mu.Lock()
	conn, blocked := s.conn, s.blocked
	s.mu.Unlock()
	switch {
	case conn == nil || conn.IsClosed():
		return fmt.Errorf("rabbitmq sink %s: probe: not connected", s.cfg.Name)
	case blocked != nil:
		return fmt.Errorf("rabbitmq sink %s: probe: %w", s.cfg.Name, blocked)
	}
	err := wait(ctx, func() error {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		return ch.Close()
	})
	if err != nil {
		return fmt.Errorf("rabbitmq sink %s: probe (open a channel): %w", s.cfg.Name, err)
	}
	return nil
}
