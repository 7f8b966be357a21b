package rabbitbroker

import (
	"context"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/pkg/sinks"
)

var _ sinks.Prober = (*Sink)(nil)

// prober is the connection Probe asks on, which publishes nothing: a
// connection that publishes to a queue that takes nothing is stopped by
// the broker's flow control, a channel opened on it included, while the
// broker answers (lanes.go).
type prober struct {
	mu   sync.Mutex
	conn *amqp.Connection
}

func (p *prober) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		_ = p.conn.CloseDeadline(time.Now().Add(time.Second))
		p.conn = nil
	}
}

// Probe reports whether the broker answers now, without publishing: a
// channel opened and closed on a connection of its own (on the sink's
// when the broker refuses one more), two round trips the broker answers
// whatever a queue does. So a publish whose confirm never comes (a quorum
// queue without its quorum) is told from a broker that does not answer,
// also while the sink's own connection, taken down for such a queue, is
// being opened again. A sink whose connection the broker blocked (a
// resource alarm) takes no publish: that is the sink's, and Probe says so.
func (s *Sink) Probe(ctx context.Context) error {
	s.mu.Lock()
	conn, blocked := s.conn, s.blocked
	s.mu.Unlock()
	if blocked != nil {
		return fmt.Errorf("rabbitmq sink %s: probe: %w", s.cfg.Name, blocked)
	}
	p := &s.prober
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil || p.conn.IsClosed() {
		if s.closed.Load() {
			return fmt.Errorf("rabbitmq sink %s: probe: closed", s.cfg.Name)
		}
		// The sink's own connection may be down while the broker answers
		// (taken down for a queue that takes nothing: lanes.go), so the
		// probe does not ask whether it is up.
		c, err := Dial(ctx, s.cfg.URL, "delaybridge sink "+s.cfg.Name+" (probe)", s.cfg.Auth)
		switch {
		case err == nil:
			p.conn = c
		case conn != nil && !conn.IsClosed():
			// A broker that refuses one more connection (a limit on the
			// user's or the vhost's) answers on the sink's own.
			s.log.Debug("rabbitmq sink probe: no connection of its own; asking on the sink's", "err", err)
			c = conn
		default:
			return fmt.Errorf("rabbitmq sink %s: probe: not connected: %w", s.cfg.Name, err)
		}
		return s.openClose(ctx, c)
	}
	return s.openClose(ctx, p.conn)
}

// openClose opens and closes a channel on c, closing c when that fails
// (unless it is the sink's own connection, which supervise watches).
func (s *Sink) openClose(ctx context.Context, c *amqp.Connection) error {
	p := &s.prober
	err := wait(ctx, func() error {
		ch, err := c.Channel()
		if err != nil {
			return err
		}
		return ch.Close()
	})
	if err != nil {
		if c == p.conn {
			_ = c.CloseDeadline(time.Now())
			p.conn = nil
		}
		return fmt.Errorf("rabbitmq sink %s: probe (open a channel): %w", s.cfg.Name, err)
	}
	return nil
}
