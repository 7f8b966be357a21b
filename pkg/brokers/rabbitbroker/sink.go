package rabbitbroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/pkg/lifecycle"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// SinkParams of a RabbitMQ sink.
type SinkParams struct {
	Name     string // sink name, for the connection name and logs
	URL      string // amqp:// or amqps://user:pass@host:port/vhost
	Exchange string // "" is the default exchange (the destination is then a queue name)
	// Auth is the TLS and authentication: tls (amqps:// URLs), username
	// and password overriding the URL's, or external (SASL EXTERNAL with
	// the TLS client certificate). See DialConfig.
	Auth Auth
	// Mandatory makes a message that the exchange routes to no queue a
	// failed publish ("unroutable"), instead of one the broker drops.
	Mandatory bool
}

const (
	// poolSize is the number of publishing channels. Concurrent Publish
	// calls use different channels; one batch stays on one channel.
	poolSize = 4
	// maxInFlight caps unconfirmed publishes per channel (and sizes the
	// confirm and return buffers, which amqp091-go needs to have room for
	// every outstanding confirm).
	maxInFlight = 4096
)

// ErrUnroutable is wrapped by the error of a mandatory publish the broker
// returned because no queue is bound for its routing key.
var ErrUnroutable = errors.New("unroutable")

// ErrNacked is wrapped by the error of a publish the broker confirmed with
// a nack: a queue it was routed to refused it.
var ErrNacked = errors.New("the broker nacked the publish")

// Sink publishes to RabbitMQ. Create it with New.
type Sink struct {
	cfg   SinkParams
	user  string // the user the connection logs in as ("" unknown), the one user_id it may publish
	log   *slog.Logger
	state *State

	stop context.CancelFunc
	done chan struct{}

	mu      sync.Mutex
	conn    *amqp.Connection // nil while disconnected
	pool    [poolSize]*pubChan
	blocked error         // the broker blocked the connection (resource alarm)
	up      chan struct{} // closed while connected
	quick   bool          // reconnecting at once: the broker closed the connection for a publish, or it was lost, or abandoned
	next    atomic.Uint32
	// abandoned is the last connection closed for answering no publish
	// (abandon, lanes.go).
	abandoned *amqp.Connection

	quarantine quarantine // suspects and poisoned destinations (quarantine.go)
	lanes      lanes      // destinations published apart (lanes.go)
	prober     prober     // Probe's own connection (probe.go)
	closed     atomic.Bool

	// noExchange is why the configured exchange cannot be used (it does not
	// exist); nil when it can. Ready reports it, so that the sink's messages
	// are held, not tried; watchExchange looks again until it exists.
	noExchange atomic.Pointer[error]
}

var _ sinks.Sink = (*Sink)(nil)
var _ sinks.Ready = (*Sink)(nil)

// New connects and opens the publishing channels. It fails when the first
// connection fails (a wrong URL or credentials show at once); later outages
// are retried for ever. A missing exchange is not fatal: it may be declared
// later, and until then the sink is not ready (noExchange).
func NewSink(ctx context.Context, cfg SinkParams, log *slog.Logger) (*Sink, error) {
	if log == nil {
		log = slog.Default()
	}
	s := &Sink{
		cfg:   cfg,
		user:  loginUser(cfg.URL, cfg.Auth),
		log:   log.With("sink", cfg.Name),
		state: NewState(),
		done:  make(chan struct{}),
		up:    make(chan struct{}),
	}
	conn, err := s.connect(ctx)
	switch {
	case err != nil && Unreachable(err):
		// No broker answers now (down, or not started yet): the sink
		// connects as soon as one does (supervise), and meanwhile is not
		// ready, so that its messages are held and the daemon's other
		// sinks and ingests go on. A broker that answers and refuses
		// (credentials, vhost, TLS) is a configuration error, which stops
		// the start.
		s.state.Down(fmt.Errorf("not connected yet, connecting: %w", err))
		s.log.Warn("rabbitmq sink cannot reach its broker: its messages are held until it connects, which it keeps trying", "err", err)
		conn = nil
	case err != nil:
		return nil, fmt.Errorf("rabbitmq sink %s: %w", cfg.Name, err)
	default:
		s.checkExchange(conn)
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stop = stop
	go s.supervise(runCtx, conn)
	if cfg.Exchange != "" {
		go s.watchExchange(runCtx)
	}
	return s, nil
}

// exchangeRecheck is how often a sink whose exchange does not exist looks
// again.
const exchangeRecheck = 2 * time.Second

// watchExchange looks at the configured exchange again every
// exchangeRecheck while it is missing (noExchange), until ctx ends.
func (s *Sink) watchExchange(ctx context.Context) {
	lifecycle.Every(ctx, exchangeRecheck, func() {
		if s.noExchange.Load() == nil {
			return
		}
		s.mu.Lock()
		conn := s.conn
		s.mu.Unlock()
		if conn != nil {
			s.checkExchange(conn)
		}
	})
}

// connect dials and opens the pool.
func (s *Sink) connect(ctx context.Context) (*amqp.Connection, error) {
	conn, err := Dial(ctx, s.cfg.URL, "delaybridge sink "+s.cfg.Name, s.cfg.Auth)
	if err != nil {
		return nil, err
	}
	var pool [poolSize]*pubChan
	for i := range pool {
		if pool[i], err = s.openChan(conn); err != nil {
			_ = conn.Close()
			return nil, err
		}
	}
	s.mu.Lock()
	s.conn, s.pool, s.blocked, s.quick = conn, pool, nil, false
	close(s.up)
	s.mu.Unlock()
	s.state.Up()
	return conn, nil
}

// loginUser is the user a connection with rawURL and a logs in as, or ""
// when the broker decides (SASL EXTERNAL maps the certificate to a user).
func loginUser(rawURL string, a Auth) string {
	switch {
	case a.External:
		return ""
	case a.Username != "":
		return a.Username
	}
	u, err := amqp.ParseURI(rawURL) // guest when the URL has no user, as amqp091-go logs in
	if err != nil {
		return ""
	}
	return u.Username
}

// checkExchange records whether the configured exchange exists
// (noExchange), and warns when it starts to be missing.
func (s *Sink) checkExchange(conn *amqp.Connection) {
	if s.cfg.Exchange == "" {
		return
	}
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	err = ch.ExchangeDeclarePassive(s.cfg.Exchange, amqp.ExchangeDirect, false, false, false, false, nil)
	switch {
	case err == nil:
		if s.noExchange.Swap(nil) != nil {
			s.log.Info("rabbitmq sink exchange declared: publishing its held messages", "exchange", s.cfg.Exchange)
		}
	case Code(err) == amqp.NotFound:
		if s.noExchange.Swap(&err) == nil {
			s.log.Warn("rabbitmq sink exchange does not exist: its messages are held until it is declared", "exchange", s.cfg.Exchange, "err", err)
		}
	default:
		s.log.Warn("rabbitmq sink exchange not usable", "exchange", s.cfg.Exchange, "err", err)
	}
}

// supervise reopens channels the broker closed and reconnects with back-off
// when the connection ends, until Close.
func (s *Sink) supervise(ctx context.Context, conn *amqp.Connection) {
	defer close(s.done)
	var bo lifecycle.Backoff
	if conn == nil { // not connected at the start
		if conn = s.redial(ctx, &bo); conn == nil {
			return
		}
		s.log.Info("rabbitmq sink connected")
		s.checkExchange(conn)
	}
	for {
		err := s.watch(ctx, conn)
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		quick := attributable(err) || lost(err) || s.abandoned == conn
		s.conn = nil
		s.pool = [poolSize]*pubChan{}
		s.up = make(chan struct{})
		s.quick = quick
		s.mu.Unlock()
		_ = conn.CloseDeadline(time.Now().Add(time.Second))
		if quick {
			// The broker closed the connection for a publish (its
			// messages are published apart: isolate), or the connection
			// was lost, perhaps so: reconnecting at once tells whether
			// the broker is there; if it is, the sink is not down, and
			// publishes wait for it to reconnect.
			if lost(err) {
				s.log.Warn("rabbitmq sink connection lost; reconnecting at once", "err", err)
			} else {
				// Debug: that publish fails as its message's (an attempt),
				// which the scheduler logs at WARN at most once per
				// destination per log.repeat_interval.
				s.log.Debug("rabbitmq sink connection closed by the broker for a publish; reconnecting at once", "err", err)
			}
			if conn, err = s.connect(ctx); err == nil {
				continue
			}
			s.mu.Lock()
			s.quick = false
			s.mu.Unlock()
		}
		s.state.Down(fmt.Errorf("disconnected, reconnecting: %w", err))
		s.log.Warn("rabbitmq sink disconnected; reconnecting", "err", err)
		if conn = s.redial(ctx, &bo); conn == nil {
			return
		}
		s.log.Info("rabbitmq sink reconnected")
	}
}

// redial connects after each back-off of bo until it succeeds (the
// connection, bo reset) or ctx ends (nil).
func (s *Sink) redial(ctx context.Context, bo *lifecycle.Backoff) *amqp.Connection {
	for {
		if !bo.Wait(ctx, nil) {
			return nil
		}
		conn, err := s.connect(ctx)
		if err == nil {
			bo.Reset()
			return conn
		}
		s.state.Down(fmt.Errorf("disconnected, reconnecting: %w", err))
		s.log.Debug("rabbitmq sink reconnect failed", "err", err)
	}
}

// watch waits until conn ends (returning why) or ctx ends, replacing the
// pool's channels that die meanwhile.
func (s *Sink) watch(ctx context.Context, conn *amqp.Connection) error {
	connDown := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	for {
		s.mu.Lock()
		pool := s.pool
		s.mu.Unlock()
		// Wake when any channel of the pool dies.
		died := make(chan int, poolSize)
		stopWatch := make(chan struct{})
		for i, p := range pool {
			go func() {
				select {
				case <-p.dead:
					died <- i
				case <-stopWatch:
				}
			}()
		}
		var i int
		select {
		case <-ctx.Done():
			close(stopWatch)
			return ctx.Err()
		case e := <-connDown:
			close(stopWatch)
			return CloseReason(e, "connection")
		case b, ok := <-blocked:
			close(stopWatch)
			if !ok {
				blocked = nil // the connection is closing: connDown follows
				continue
			}
			s.setBlocked(b)
			continue
		case i = <-died:
			close(stopWatch)
			if conn.IsClosed() {
				// The connection went with it: say why it did.
				t := time.NewTimer(time.Second)
				select {
				case e := <-connDown:
					t.Stop()
					return CloseReason(e, "connection")
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
				}
			}
		}
		if attributable(pool[i].err) {
			// For a publish: logged as its message's failure (above).
			s.log.Debug("rabbitmq sink channel closed by the broker for a publish; reopening", "err", pool[i].err)
		} else {
			s.log.Warn("rabbitmq sink channel closed by the broker; reopening", "err", pool[i].err)
		}
		p, err := s.openChan(conn)
		if err != nil {
			// The connection is going away too: connDown will say so.
			s.log.Debug("reopen channel", "err", err)
			if conn.IsClosed() {
				return fmt.Errorf("reopen channel: %w", err)
			}
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
			continue
		}
		s.mu.Lock()
		s.pool[i] = p
		s.mu.Unlock()
	}
}

func (s *Sink) setBlocked(b amqp.Blocking) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b.Active {
		s.blocked = fmt.Errorf("the broker blocks publishing on this connection: %s", b.Reason)
		s.log.Warn("rabbitmq sink blocked by the broker (resource alarm)", "reason", b.Reason)
	} else {
		s.blocked = nil
		s.log.Info("rabbitmq sink unblocked")
	}
}

// pick returns a live channel of the pool, round robin, or nil.
func (s *Sink) pick() *pubChan {
	start := s.next.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range uint32(poolSize) {
		p := s.pool[(start+k)%poolSize]
		if p != nil && !p.isDead() {
			return p
		}
	}
	return nil
}

// Publish publishes msgs on one channel of the pool and awaits their
// confirms. A message that cannot be expressed in AMQP (routing key or
// header name over 255 bytes) fails permanently; everything else that fails
// is retried by the scheduler.
//
// When the broker closes the channel or the connection for a publish
// (attributable), the publishes it cut off are published again apart
// (isolate): the message that made the broker close it fails Rejected,
// the others are confirmed as usual. A message to a destination that did
// so lately is published apart only.
func (s *Sink) Publish(ctx context.Context, msgs []sinks.Outgoing) []error {
	errs := make([]error, len(msgs))
	pubs := make([]amqp.Publishing, len(msgs))
	now := time.Now()
	var apart []int // to a poisoned destination: published in the quarantine only
	for i, m := range msgs {
		pubs[i], errs[i] = toAMQP(m, s.user)
		if errs[i] != nil {
			errs[i] = fmt.Errorf("rabbitmq sink %s: %w", s.cfg.Name, errs[i])
		} else if s.quarantine.poisoned(m.Destination, now) {
			apart = append(apart, i)
			errs[i] = &closedError{err: fmt.Errorf("rabbitmq sink %s: routing key %q made the broker close a channel lately: published apart", s.cfg.Name, m.Destination)}
		}
	}
	if err := sinks.Expired(ctx); err != nil {
		return sinks.Fill(errs, fmt.Errorf("rabbitmq sink %s: not sent: %w", s.cfg.Name, err))
	}
	s.mu.Lock()
	blocked := s.blocked
	s.mu.Unlock()
	if blocked != nil {
		// The broker reads nothing more from this connection: what is sent
		// now waits in it, its confirms with it, and comes back as copies
		// once the publishes time out and are tried again. Not sent (those
		// for the quarantine neither): held until the broker unblocks
		// (Ready).
		for _, i := range apart {
			errs[i] = nil
		}
		return sinks.Fill(errs, fmt.Errorf("rabbitmq sink %s: not sent: %w", s.cfg.Name, blocked))
	}
	if len(apart) < len(msgs) {
		p := s.pick()
		if p == nil {
			p = s.awaitReconnect(ctx)
		}
		if p == nil {
			err := s.state.Err()
			if closed := s.closedByBroker(); closed != nil {
				err = closed // being reopened: published in the quarantine meanwhile
			} else if err == nil {
				err = errors.New("no open channel")
			}
			for i := range errs {
				if errs[i] == nil {
					errs[i] = fmt.Errorf("rabbitmq sink %s: not connected: %w", s.cfg.Name, err)
				}
			}
		} else if sinks.IsApart(ctx) {
			s.publishApart(ctx, p, msgs, pubs, errs)
		} else {
			s.publishPool(ctx, p, msgs, pubs, errs)
		}
	}
	var suspects []int
	for i, err := range errs {
		if suspect(err) {
			suspects = append(suspects, i)
		}
		if s.cfg.Exchange != "" && Code(err) == amqp.NotFound && !attributable(err) && s.noExchange.CompareAndSwap(nil, &err) {
			// Deleted while running: held from now on, looked at again.
			s.log.Warn("rabbitmq sink exchange does not exist: its messages are held until it is declared", "exchange", s.cfg.Exchange, "err", err)
		}
	}
	if len(suspects) > 0 {
		s.isolate(ctx, msgs, pubs, errs, suspects)
		if s.state.Err() == nil {
			// A suspect the quarantine could not decide (no probe or time
			// left: many messages to a destination the broker closes for)
			// while the sink is connected is not the sink's fault: it is
			// published again soon, and the sink is not held for it.
			for _, i := range suspects {
				var c *closedError
				if errors.As(errs[i], &c) && !c.lost {
					errs[i] = sinks.Again(errs[i])
				}
			}
		}
	}
	return errs
}

// closedByBroker is the closedError of a channel of the pool that the
// broker closed for a publish, before supervise saw the connection go.
func (s *Sink) closedByBroker() error {
	s.mu.Lock()
	pool := s.pool
	s.mu.Unlock()
	for _, p := range pool {
		if p == nil || !p.isDead() {
			continue
		}
		p.mu.Lock()
		err := p.err
		p.mu.Unlock()
		if suspect(err) {
			return err
		}
	}
	return nil
}

// awaitReconnect waits, when the broker closed the connection for a
// publish and the sink reconnects at once, for a channel of the new
// connection (at most quickReconnect, or until ctx ends); nil otherwise.
func (s *Sink) awaitReconnect(ctx context.Context) *pubChan {
	s.mu.Lock()
	up, quick := s.up, s.quick
	s.mu.Unlock()
	if !quick {
		return nil
	}
	t := time.NewTimer(quickReconnect)
	defer t.Stop()
	select {
	case <-up:
		return s.pick()
	case <-t.C:
	case <-ctx.Done():
	}
	return nil
}

// Ready returns nil while connected and not blocked by the broker.
func (s *Sink) Ready() error {
	if err := s.state.Err(); err != nil {
		return fmt.Errorf("rabbitmq sink %s: %w", s.cfg.Name, err)
	}
	if s.noExchange.Load() != nil {
		return fmt.Errorf("rabbitmq sink %s: exchange %q does not exist (declare it, or fix the sink's exchange); its messages are held until it does", s.cfg.Name, s.cfg.Exchange)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blocked != nil {
		return fmt.Errorf("rabbitmq sink %s: %w", s.cfg.Name, s.blocked)
	}
	return nil
}

// Close closes the connection. Publish has already waited for its confirms;
// one still waiting fails.
func (s *Sink) Close() error {
	s.closed.Store(true) // no lane or probe connects from now on
	s.stop()
	<-s.done
	s.closeQuarantine()
	s.closeLanes()
	s.prober.close()
	s.mu.Lock()
	conn := s.conn
	s.conn = nil
	s.mu.Unlock()
	s.state.Down(errors.New("closed"))
	if conn != nil {
		_ = conn.CloseDeadline(time.Now().Add(5 * time.Second))
	}
	return nil
}
