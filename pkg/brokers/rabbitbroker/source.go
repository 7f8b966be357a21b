package rabbitbroker

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/delaybridge/delaybridge/pkg/lifecycle"
)

// SourceParams of a RabbitMQ ingest.
type SourceParams struct {
	Name  string // ingest name, for the connection name and logs
	URL   string // amqp:// or amqps://user:pass@host:port/vhost
	Queue string // declared durable (classic) when it does not exist; used as it is otherwise
	// Auth is the TLS and authentication: tls (amqps:// URLs), username
	// and password overriding the URL's, or external (SASL EXTERNAL with
	// the TLS client certificate). See DialConfig.
	Auth Auth
	// Prefetch is the channel's QoS: how many unacknowledged messages the
	// broker sends ahead (required; at most MaxPrefetch).
	Prefetch int
	// Bindings bind the queue to exchanges at every connect (see Binding).
	Bindings []Binding
}

// ErrStaleDelivery is returned (wrapped) by an AckFunc whose message came
// from a channel that has closed since: the broker has requeued the message
// and delivers it again.
var ErrStaleDelivery = errors.New("the channel that delivered the message is gone; the broker delivers it again")

// Source is a RabbitMQ ingest. Create it with NewSource.
type Source struct {
	cfg   SourceParams
	log   *slog.Logger
	state *State

	out    chan delivery // supervisor -> Read
	closed chan struct{} // closed by Close
	stop   context.CancelFunc
	done   chan struct{} // supervisor exited

	mu       sync.Mutex
	cur      *session      // nil while disconnected
	isClose  bool          // Close has begun: no new sessions
	closing  bool          // Close is draining: no new acks
	released bool          // Release was called, Resume not yet: no new sessions
	resume   chan struct{} // closed by Resume; made by Release
	acks     sync.WaitGroup
	// ackSeq numbers the acks sent (AckMark); sent holds, for the sessions
	// of the latest acks (at most maxSentSessions), the number of the last
	// ack each took, and forgot the last number of a session dropped from
	// it (ConfirmAcks).
	ackSeq uint64
	sent   []sentAcks
	forgot uint64
	// requeued is the number of the last ack that a hand-back (Release)
	// answered for: not sent, its message delivered again (ConfirmAcks).
	requeued uint64

	closeOnce sync.Once
	closeErr  error
}

var _ ingest.Source = (*Source)(nil)
var _ ingest.Ready = (*Source)(nil)
var _ ingest.Releaser = (*Source)(nil)
var _ ingest.AckConfirmer = (*Source)(nil)

// sentAcks is a session and the number of the last ack sent on it.
type sentAcks struct {
	sess *session
	last uint64
}

// maxSentSessions bounds the sessions ConfirmAcks remembers acks of: one
// per reconnect, and a batch's acks span one or two.
const maxSentSessions = 8

// AckMark implements ingest.AckConfirmer: the number of the last ack sent.
func (s *Source) AckMark() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ackSeq
}

// ConfirmAcks returns once the broker has processed every ack sent after
// mark: AMQP has no reply to basic.ack, so it sends a synchronous method on
// each channel they went out on (basic.qos, answered by qos-ok), which
// the broker answers after everything sent before it on that channel. It
// returns an error when such a channel has closed since, or closes before
// the answer: the broker may not have processed them, and delivers those
// messages again with redelivered set (re-reads, see ingest.AckConfirmer).
// Acks that other batches sent meanwhile are confirmed with them.
func (s *Source) ConfirmAcks(ctx context.Context, mark uint64) error {
	s.mu.Lock()
	if s.forgot > mark {
		s.mu.Unlock()
		return fmt.Errorf("rabbitmq ingest %s: acks went out on more channels than are remembered; cannot tell whether the broker processed them", s.cfg.Name)
	}
	if s.requeued > mark {
		s.mu.Unlock()
		return fmt.Errorf("rabbitmq ingest %s: acks were not sent: the deliveries were handed back (Release), and the broker delivers them again", s.cfg.Name)
	}
	var sessions []*session
	for _, e := range s.sent {
		if e.last > mark {
			sessions = append(sessions, e.sess)
		}
	}
	s.mu.Unlock()
	for _, sess := range sessions {
		select {
		case <-sess.dead:
			return fmt.Errorf("rabbitmq ingest %s: acks went out on a channel that closed before the broker was seen to process them", s.cfg.Name)
		default:
		}
		if err := wait(ctx, func() error { return sess.ch.Qos(s.cfg.Prefetch, 0, false) }); err != nil {
			return fmt.Errorf("rabbitmq ingest %s: confirm acks: %w", s.cfg.Name, err)
		}
	}
	return nil
}

// ackRequeued records an ack not sent because Release handed its delivery
// back, for ConfirmAcks.
func (s *Source) ackRequeued() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ackSeq++
	s.requeued = s.ackSeq
}

// ackSent records an ack sent on sess, for ConfirmAcks.
func (s *Source) ackSent(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ackSeq++
	for i := len(s.sent) - 1; i >= 0; i-- {
		if s.sent[i].sess == sess {
			s.sent[i].last = s.ackSeq
			return
		}
	}
	s.sent = append(s.sent, sentAcks{sess: sess, last: s.ackSeq})
	if len(s.sent) > maxSentSessions {
		s.forgot = s.sent[0].last
		s.sent = slices.Delete(s.sent, 0, 1)
	}
}

// Release closes the consuming channel, so that the broker requeues every
// delivery not acknowledged yet (those Read returned and those the channel
// held), and opens none until Resume: the queue's other consumers take
// them. Acknowledging a delivery of the closed channel does nothing.
func (s *Source) Release(context.Context) error {
	s.mu.Lock()
	if s.released {
		s.mu.Unlock()
		return nil
	}
	s.released, s.resume = true, make(chan struct{})
	sess := s.cur
	s.mu.Unlock()
	if sess != nil {
		_ = sess.ch.Close()
	}
	s.log.Info("rabbitmq ingest released: its deliveries requeued, consuming stopped until redis is back")
	return nil
}

// Resume consumes again after Release.
func (s *Source) Resume(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released {
		s.released = false
		close(s.resume)
		s.log.Info("rabbitmq ingest resumed")
	}
	return nil
}

// waitResume waits while the Source is released; false when it closed.
func (s *Source) waitResume(ctx context.Context) bool {
	s.mu.Lock()
	released, resume := s.released, s.resume
	s.mu.Unlock()
	if !released {
		return true
	}
	select {
	case <-resume:
		return true
	case <-s.closed:
		return false
	case <-ctx.Done():
		return false
	}
}

// session is one connection with its consuming channel.
type session struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	tag      string
	msgs     <-chan amqp.Delivery
	connDown chan *amqp.Error
	chDown   chan *amqp.Error
	dead     chan struct{} // closed when the session has ended
}

type delivery struct {
	d    amqp.Delivery
	sess *session
}

// New connects, makes sure the queue exists and starts consuming. It fails
// when the first connection fails (a wrong URL or credentials show at once);
// later outages are retried for ever.
func NewSource(ctx context.Context, cfg SourceParams, log *slog.Logger) (*Source, error) {
	if cfg.Prefetch < 1 || cfg.Prefetch > MaxPrefetch {
		return nil, fmt.Errorf("rabbitmq ingest %s: prefetch %d is not between 1 and %d", cfg.Name, cfg.Prefetch, MaxPrefetch)
	}
	if cfg.Queue == "" {
		return nil, fmt.Errorf("rabbitmq ingest %s: no queue", cfg.Name)
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Source{
		cfg:    cfg,
		log:    log.With("ingest", cfg.Name, "queue", cfg.Queue),
		state:  NewState(),
		out:    make(chan delivery),
		closed: make(chan struct{}),
		done:   make(chan struct{}),
	}
	sess, err := s.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq ingest %s: %w", cfg.Name, err)
	}
	s.cur = sess
	s.state.Up()
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stop = stop
	go s.supervise(runCtx, sess)
	return s, nil
}

// connect dials, declares the queue if it is missing, sets the QoS and
// starts the consumer.
func (s *Source) connect(ctx context.Context) (*session, error) {
	cfg := s.cfg
	conn, err := Dial(ctx, cfg.URL, "delaybridge ingest "+cfg.Name, cfg.Auth)
	if err != nil {
		return nil, err
	}
	sess, err := s.setup(conn)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return sess, nil
}

func (s *Source) setup(conn *amqp.Connection) (*session, error) {
	q := s.cfg.Queue
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if _, err := ch.QueueDeclarePassive(q, false, false, false, false, nil); err != nil {
		if Code(err) != amqp.NotFound {
			return nil, fmt.Errorf("queue %q: %w", q, err)
		}
		// The failed passive declare closed the channel.
		if ch, err = conn.Channel(); err != nil {
			return nil, fmt.Errorf("open channel: %w", err)
		}
		args := amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic}
		if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
			return nil, fmt.Errorf("declare queue %q: %w", q, err)
		}
		s.log.Info("declared missing queue (durable, classic)")
	}
	if err := s.bind(ch); err != nil {
		return nil, err
	}
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("qos: %w", err)
	}
	sess := &session{
		conn:     conn,
		ch:       ch,
		tag:      consumerTag(s.cfg.Name),
		connDown: conn.NotifyClose(make(chan *amqp.Error, 1)),
		chDown:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		dead:     make(chan struct{}),
	}
	sess.msgs, err = ch.Consume(q, sess.tag, false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consume queue %q: %w", q, err)
	}
	return sess, nil
}

// bind declares the exchanges that say so and binds the queue to each
// exchange with its routing key; both are idempotent, so every connect does
// it again. An error closes the channel (the connect fails).
func (s *Source) bind(ch *amqp.Channel) error {
	q := s.cfg.Queue
	for _, b := range s.cfg.Bindings {
		if b.ExchangeType != "" {
			if err := ch.ExchangeDeclare(b.Exchange, b.ExchangeType, true, false, false, false, nil); err != nil {
				return fmt.Errorf("declare exchange %q (%s, durable): %w (an exchange of that name exists with another type or arguments? delete it or leave exchange_type out)", b.Exchange, b.ExchangeType, err)
			}
		} else if err := ch.ExchangeDeclarePassive(b.Exchange, "", false, false, false, false, nil); err != nil {
			if Code(err) == amqp.NotFound {
				return fmt.Errorf("bindings: exchange %q does not exist: declare it, or give exchange_type to let delaybridge declare it", b.Exchange)
			}
			return fmt.Errorf("exchange %q: %w", b.Exchange, err)
		}
		if err := ch.QueueBind(q, b.RoutingKey, b.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %q to exchange %q with routing key %q: %w", q, b.Exchange, b.RoutingKey, err)
		}
		s.log.Debug("queue bound", "exchange", b.Exchange, "routing_key", b.RoutingKey)
	}
	return nil
}

func consumerTag(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "delaybridge-" + name + "-" + hex.EncodeToString(b[:])
}

// supervise forwards the deliveries of the current session to Read, and
// reconnects with back-off when the session ends, until Close.
func (s *Source) supervise(ctx context.Context, sess *session) {
	defer close(s.done)
	var bo lifecycle.Backoff
	for {
		reason := s.forward(sess)
		if reason == nil { // closing: Close tears the session down
			return
		}
		s.mu.Lock()
		s.cur = nil
		s.mu.Unlock()
		close(sess.dead)
		s.mu.Lock()
		released := s.released
		s.mu.Unlock()
		if released {
			s.state.Down(errors.New("released: consuming stopped until redis is back"))
		} else {
			s.state.Down(fmt.Errorf("disconnected, reconnecting: %w", reason))
			s.log.Warn("rabbitmq ingest disconnected; reconnecting", "err", reason)
		}
		_ = sess.conn.CloseDeadline(time.Now().Add(time.Second))

		for {
			if !s.waitResume(ctx) {
				return
			}
			if !bo.Wait(ctx, s.closed) {
				return
			}
			next, err := s.connect(ctx)
			if err != nil {
				s.state.Down(fmt.Errorf("disconnected, reconnecting: %w", err))
				s.log.Debug("rabbitmq ingest reconnect failed", "err", err)
				continue
			}
			s.mu.Lock()
			if s.isClose {
				s.mu.Unlock()
				_ = next.conn.Close()
				return
			}
			s.cur = next
			s.mu.Unlock()
			sess = next
			break
		}
		bo.Reset()
		s.state.Up()
		s.log.Info("rabbitmq ingest reconnected")
	}
}

// forward passes sess's deliveries to Read until the session ends (it
// returns why) or the Source closes (it returns nil). A delivery it holds
// when the session ends is dropped: the broker requeues it.
func (s *Source) forward(sess *session) error {
	for {
		select {
		case <-s.closed:
			return nil
		case e := <-sess.connDown:
			return CloseReason(e, "connection")
		case e := <-sess.chDown:
			return CloseReason(e, "channel")
		case d, ok := <-sess.msgs:
			if !ok {
				return sess.endReason()
			}
			select {
			case s.out <- delivery{d: d, sess: sess}:
			case <-s.closed:
				return nil
			case e := <-sess.connDown:
				return CloseReason(e, "connection")
			case e := <-sess.chDown:
				return CloseReason(e, "channel")
			}
		}
	}
}

// endReason says why the delivery channel closed: the channel or connection
// went away, or the broker cancelled the consumer (the queue was deleted).
func (sess *session) endReason() error {
	select {
	case e := <-sess.connDown:
		return CloseReason(e, "connection")
	case e := <-sess.chDown:
		return CloseReason(e, "channel")
	default:
		return errors.New("the broker cancelled the consumer (queue deleted?)")
	}
}

// Read returns the next message.
func (s *Source) Read(ctx context.Context) (*envelope.Incoming, ingest.AckFunc, error) {
	select {
	case <-s.closed:
		return nil, nil, ingest.ErrClosed
	default:
	}
	select {
	case d := <-s.out:
		in := &envelope.Incoming{
			Headers:     Headers(d.d.Headers),
			Properties:  Properties(d.d),
			Body:        d.d.Body,
			NativeID:    d.d.MessageId,
			Source:      d.d.RoutingKey, // as published, whatever exchange routed it here
			Redelivered: d.d.Redelivered,
		}
		in.Origin.Print = contentPrint(in)
		return in, s.ackFunc(d.sess, d.d.DeliveryTag), nil
	case <-s.closed:
		return nil, nil, ingest.ErrClosed
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// ackFunc acks or nacks delivery tag of sess, on sess's own channel only.
func (s *Source) ackFunc(sess *session, tag uint64) ingest.AckFunc {
	return func(_ context.Context, handleErr error) error {
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			return fmt.Errorf("rabbitmq ingest %s: source closed before the message was acknowledged; the broker delivers it again", s.cfg.Name)
		}
		s.acks.Add(1)
		s.mu.Unlock()
		defer s.acks.Done()

		select {
		case <-sess.dead:
			s.mu.Lock()
			released := s.released
			s.mu.Unlock()
			if released {
				s.ackRequeued()
				return nil // requeued by Release
			}
			return fmt.Errorf("rabbitmq ingest %s: %w", s.cfg.Name, ErrStaleDelivery)
		default:
		}
		var err error
		if handleErr == nil {
			err = sess.ch.Ack(tag, false)
			if err == nil {
				s.ackSent(sess)
			}
		} else {
			err = sess.ch.Nack(tag, false, true)
		}
		if err != nil {
			if sess.ch.IsClosed() {
				s.mu.Lock()
				released := s.released
				s.mu.Unlock()
				if released {
					s.ackRequeued()
					return nil // requeued by Release
				}
				return fmt.Errorf("rabbitmq ingest %s: %w (%v)", s.cfg.Name, ErrStaleDelivery, err)
			}
			return fmt.Errorf("rabbitmq ingest %s: ack or nack delivery: %w", s.cfg.Name, err)
		}
		return nil
	}
}

// Ready returns nil while connected and consuming, else why not.
func (s *Source) Ready() error {
	if err := s.state.Err(); err != nil {
		return fmt.Errorf("rabbitmq ingest %s: %w", s.cfg.Name, err)
	}
	return nil
}

// Close cancels the consumer, waits until the acks already given have been
// sent, and closes the channel and the connection (the broker requeues
// every message delivered but not acked). It returns early with ctx.Err()
// when ctx ends.
func (s *Source) Close(ctx context.Context) error {
	s.closeOnce.Do(func() { s.closeErr = s.close(ctx) })
	return s.closeErr
}

func (s *Source) close(ctx context.Context) error {
	s.mu.Lock()
	s.isClose = true
	sess := s.cur
	s.mu.Unlock()
	close(s.closed)
	s.stop()

	if sess != nil {
		// Stop the broker sending more; deliveries already buffered are
		// never read, hence requeued when the channel closes.
		if err := wait(ctx, func() error { return sess.ch.Cancel(sess.tag, false) }); err != nil {
			s.log.Debug("cancel consumer", "err", err)
		}
	}
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	var errs []error
	if err := wait(ctx, func() error { s.acks.Wait(); return nil }); err != nil {
		errs = append(errs, fmt.Errorf("rabbitmq ingest %s: waiting for acks: %w", s.cfg.Name, err))
	}
	if sess != nil {
		// channel.close is answered after the broker processed every
		// frame sent before it on the channel: the acks have arrived.
		if err := wait(ctx, sess.ch.Close); err != nil && !errors.Is(err, amqp.ErrClosed) {
			s.log.Debug("close channel", "err", err)
		}
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(5 * time.Second)
		}
		_ = sess.conn.CloseDeadline(deadline)
	}
	if err := wait(ctx, func() error { <-s.done; return nil }); err != nil {
		errs = append(errs, err)
	}
	s.state.Down(errors.New("closed"))
	return errors.Join(errs...)
}

// wait runs f and waits for it or for ctx, whichever is first.
func wait(ctx context.Context, f func() error) error {
	res := make(chan error, 1)
	go func() { res <- f() }()
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// redeliveryHeaders are the headers RabbitMQ adds to a message as it
// delivers it again: a quorum queue's count of deliveries (and of
// acquisitions, since RabbitMQ 4.0).
var redeliveryHeaders = []string{"x-delivery-count", "x-acquired-count"}

// contentPrint is the fingerprint of a delivery's content (envelope.Origin.Print):
// a redelivery of the message has the same; a new publish that reuses its
// ID (a Celery task retried, a timer armed again) differs in a header, a
// property or the body, and is parked as the new message it is. The
// headers a broker adds as it redelivers (redeliveryHeaders) are not the
// content.
func contentPrint(in *envelope.Incoming) uint64 {
	h := xxhash.New()
	var n [binary.MaxVarintLen64]byte
	count := func(c int) { _, _ = h.Write(n[:binary.PutUvarint(n[:], uint64(c))]) }
	field := func(s string) {
		count(len(s))
		_, _ = h.WriteString(s)
	}
	field(in.Source)
	for _, list := range []envelope.Headers{in.Headers, in.Properties} {
		content := slices.DeleteFunc(slices.Clone(list), func(kv envelope.Header) bool {
			return slices.ContainsFunc(redeliveryHeaders, func(r string) bool { return strings.EqualFold(kv.Key, r) })
		})
		count(len(content))
		for _, kv := range content {
			field(kv.Key)
			field(kv.Value)
			field(kv.Native)
		}
	}
	_, _ = h.Write(in.Body)
	if p := h.Sum64(); p != 0 {
		return p
	}
	return 1 // 0 means no print
}
