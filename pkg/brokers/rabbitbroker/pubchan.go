package rabbitbroker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// pubChan is one channel in confirm mode with the bookkeeping that maps the
// broker's confirms and returns back to the publishes awaiting them.
//
// Correlation: publishes on a channel are serialized (pubMu), so the next
// delivery tag (GetNextPublishSeqNo) is the one the broker will confirm;
// the entry is registered under that tag before the frame is sent. One
// goroutine (dispatch) reads both the confirms and the returns. The broker
// sends a message's basic.return before its basic.ack, and amqp091-go
// hands the return to our channel before it handles that ack, so when a
// confirm is read, its return (if any) is already in the returns buffer:
// dispatch drains that buffer first. Returns carry no delivery tag; they are
// matched by (exchange, routing key, message_id). Two publishes in flight
// with the same key go to the same queues and share their fate, so the
// match cannot blame the wrong one in practice.
type pubChan struct {
	ch   *amqp.Channel
	conn *amqp.Connection // the connection it is a channel of
	sem  chan struct{}    // one slot per unconfirmed publish
	// answeredAt is when the broker last answered a publish on it (a
	// confirm, ack or nack), Unix nanoseconds; 0 never.
	answeredAt atomic.Int64

	pubMu sync.Mutex // serializes publishes: tag = GetNextPublishSeqNo

	mu       sync.Mutex
	wake     chan struct{} // closed at the next answer, for awaitAnswer; nil when none waits
	pending  map[uint64]entry
	lowest   uint64 // every tag below it is resolved (confirmed, refused or lost)
	returned map[returnKey]returnInfo
	err      error         // why the channel died; set before dead closes
	dead     chan struct{} // closed when the channel is gone and every pending entry failed (a confirmed one is left to its publisher)
}

type entry struct {
	b   *batch
	i   int
	key returnKey
	// dc is the library's own confirmation of the publish, which has the
	// broker's answer right: its NotifyPublish listener reports a nack
	// that came out of order as an ack when a later multiple ack covers it
	// (amqp091-go 1.16 confirms.Multiple), and RabbitMQ answers just so
	// when a queue refuses a message (reject-publish) while another
	// queue's acks come in batches. nil until the publish returned.
	dc *amqp.DeferredConfirmation
	// confirmed: the confirm came before the publish returned; the
	// publisher settles the entry once it has dc.
	confirmed bool
}

type returnKey struct{ exchange, routingKey, messageID string }

type returnInfo struct {
	n    int
	code uint16
	text string
}

// batch collects the results of one Publish call. left counts unresolved
// entries plus one held by the publisher until all are registered.
type batch struct {
	errs      []error
	resolved  []bool
	left      int
	done      chan struct{}
	abandoned bool // Publish returned (ctx ended); results are dropped
}

func (s *Sink) openChan(conn *amqp.Connection) (*pubChan, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	p := &pubChan{
		ch:       ch,
		conn:     conn,
		sem:      make(chan struct{}, maxInFlight),
		pending:  make(map[uint64]entry),
		lowest:   1,
		returned: make(map[returnKey]returnInfo),
		dead:     make(chan struct{}),
	}
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, maxInFlight))
	returns := ch.NotifyReturn(make(chan amqp.Return, maxInFlight))
	go p.dispatch(s.cfg, confirms, returns, closes)
	return p, nil
}

// stuck reports whether a publish begun at start that waited out its time
// (errs holds a timeout) waited stuckAfter at least, and the broker
// answered no publish on the channel meanwhile: it reads nothing more of
// what the channel sends (flow control), or answers nothing (lanes.go).
func (p *pubChan) stuck(start time.Time, errs []error) bool {
	if time.Since(start) < stuckAfter || p.answeredAt.Load() >= start.UnixNano() {
		return false
	}
	return slices.ContainsFunc(errs, func(err error) bool { return errors.Is(err, context.DeadlineExceeded) })
}

// awaitAnswer waits until the broker answers a publish on p at or after
// since (nil), p dies (errLaneDead), or ctx ends (its error).
func (p *pubChan) awaitAnswer(ctx context.Context, since time.Time) error {
	for {
		if p.answeredAt.Load() >= since.UnixNano() {
			return nil
		}
		p.mu.Lock()
		if p.wake == nil {
			p.wake = make(chan struct{})
		}
		wake := p.wake
		p.mu.Unlock()
		if p.answeredAt.Load() >= since.UnixNano() { // answered before wake was set
			return nil
		}
		select {
		case <-wake:
		case <-p.dead:
			return errLaneDead
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (p *pubChan) isDead() bool {
	select {
	case <-p.dead:
		return true
	default:
		return false
	}
}

// dispatch resolves pending publishes from the confirms and returns until
// the channel closes, then fails what is left.
func (p *pubChan) dispatch(cfg SinkParams, confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, closes <-chan *amqp.Error) {
	for confirms != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			p.recordReturn(r)
		case c, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
		drain:
			for returns != nil {
				select {
				case r, ok := <-returns:
					if !ok {
						returns = nil
						break drain
					}
					p.recordReturn(r)
				default:
					break drain
				}
			}
			p.confirm(cfg, c)
		}
	}
	// amqp091-go sends the close error before it closes the confirms.
	var reason error
	select {
	case e := <-closes:
		reason = CloseReason(e, "channel")
	default:
		reason = errors.New("channel closed")
	}
	reason = describe(cfg, reason)
	switch {
	case attributable(reason):
		// The broker closed it for a publish: the pending ones, and those
		// not sent yet, are suspects (quarantine.go).
		reason = &closedError{err: reason}
	case lost(reason):
		// Perhaps so, its close unread: suspects too, never culprits.
		reason = &closedError{err: reason, lost: true}
	}
	p.mu.Lock()
	p.err = reason
	for tag, e := range p.pending {
		if e.confirmed {
			continue // confirmed before its publish returned: the publisher settles it
		}
		err := sinks.Sent(fmt.Errorf("rabbitmq sink %s: no publisher confirm, %w (the message may or may not have arrived)", cfg.Name, reason))
		if Code(reason) == amqp.AccessRefused && !suspect(reason) {
			err = sinks.Rejected(sinks.Because(sinks.ReasonUnauthorized, err)) // not authorized for that exchange
		}
		p.resolve(e, err)
		delete(p.pending, tag)
	}
	close(p.dead)
	p.mu.Unlock()
}

// describe makes the common channel and connection errors actionable.
func describe(cfg SinkParams, err error) error {
	switch Code(err) {
	case amqp.NotFound:
		return sinks.Because(sinks.ReasonNotFound, fmt.Errorf("exchange %q not found (declare it, or fix the sink's exchange): %w", cfg.Exchange, err))
	case amqp.AccessRefused:
		return sinks.Because(sinks.ReasonUnauthorized, fmt.Errorf("access refused (check the user's permissions on the exchange): %w", err))
	}
	return err
}

func (p *pubChan) recordReturn(r amqp.Return) {
	k := returnKey{r.Exchange, r.RoutingKey, r.MessageId}
	p.mu.Lock()
	ri := p.returned[k]
	ri.n++
	ri.code, ri.text = r.ReplyCode, r.ReplyText
	p.returned[k] = ri
	p.mu.Unlock()
}

func (p *pubChan) confirm(cfg SinkParams, c amqp.Confirmation) {
	p.answeredAt.Store(time.Now().UnixNano())
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.wake != nil {
		close(p.wake)
		p.wake = nil
	}
	// Confirms arrive in tag order; a tag below this one still pending had
	// its confirm dropped (amqp091-go gives up on a full listener).
	for t := p.lowest; t < c.DeliveryTag; t++ {
		if e, ok := p.pending[t]; ok && !e.confirmed {
			delete(p.pending, t)
			if e.dc != nil && isDone(e.dc) { // the library has its answer
				p.settle(cfg, e)
				continue
			}
			p.resolve(e, sinks.Sent(fmt.Errorf("rabbitmq sink %s: publisher confirm lost", cfg.Name)))
		}
	}
	if c.DeliveryTag >= p.lowest {
		p.lowest = c.DeliveryTag + 1
	}
	e, ok := p.pending[c.DeliveryTag]
	if !ok {
		return
	}
	if e.dc == nil { // its publish has not returned yet: publish settles it
		e.confirmed = true
		p.pending[c.DeliveryTag] = e
		return
	}
	delete(p.pending, c.DeliveryTag)
	p.settle(cfg, e)
}

// settle resolves a confirmed entry: with the broker's answer (e.dc,
// done), and the return that came before it, if any. p.mu is held.
func (p *pubChan) settle(cfg SinkParams, e entry) {
	var err error
	if ri, ok := p.returned[e.key]; ok && ri.n > 0 {
		ri.n--
		if ri.n == 0 {
			delete(p.returned, e.key)
		} else {
			p.returned[e.key] = ri
		}
		err = sinks.Rejected(sinks.Because(sinks.ReasonUnroutable, fmt.Errorf("rabbitmq sink %s: %w: exchange %q has no queue bound for routing key %q (returned %d %s)",
			cfg.Name, ErrUnroutable, e.key.exchange, e.key.routingKey, ri.code, ri.text)))
	} else if e.dc == nil || !e.dc.Acked() { // nil: never, in confirm mode
		// A queue it was routed to refused it: its destination's fault,
		// an attempt of this message; the sink's other destinations go on.
		err = sinks.Rejected(sinks.Because(sinks.ReasonRejected, fmt.Errorf("rabbitmq sink %s: %w: routing key %q on exchange %q: a queue it routes to refused it "+
			"(one at its x-max-length or x-max-length-bytes with x-overflow reject-publish: raise the limit, consume it, or let it drop old messages; "+
			"or a quorum queue without its leader or quorum: see its members with rabbitmq-queues quorum_status; else the queue failed)",
			cfg.Name, ErrNacked, e.key.routingKey, e.key.exchange)))
	}
	p.resolve(e, err)
}

// isDone reports whether the broker's answer to a publish is known.
func isDone(dc *amqp.DeferredConfirmation) bool {
	select {
	case <-dc.Done():
		return true
	default:
		return false
	}
}

// resolve records one result and frees its in-flight slot. p.mu is held.
func (p *pubChan) resolve(e entry, err error) {
	if !e.b.abandoned {
		e.b.errs[e.i] = err
		e.b.resolved[e.i] = true
	}
	e.b.left--
	if e.b.left == 0 {
		close(e.b.done)
	}
	<-p.sem
}

// publish sends msgs (skipping those with errs[i] set) and waits for their
// confirms, filling errs.
func (p *pubChan) publish(ctx context.Context, cfg SinkParams, msgs []sinks.Outgoing, pubs []amqp.Publishing, errs []error) {
	b := &batch{errs: make([]error, len(msgs)), resolved: make([]bool, len(msgs)), left: 1, done: make(chan struct{})}
	sent := make([]bool, len(msgs))
	var stopErr error // once set, the rest of the batch is not sent

	p.pubMu.Lock()
	for i, m := range msgs {
		if errs[i] != nil {
			continue
		}
		if stopErr != nil {
			errs[i] = stopErr
			continue
		}
		if err := sinks.Expired(ctx); err != nil { // checked first: select picks at random among ready cases
			stopErr = fmt.Errorf("rabbitmq sink %s: not sent: %w", cfg.Name, err)
			errs[i] = stopErr
			continue
		}
		select {
		case p.sem <- struct{}{}:
		case <-p.dead:
			stopErr = p.deadErr(cfg)
			errs[i] = stopErr
			continue
		case <-ctx.Done():
			// Not sent, and a timeout all the same (not sinks.NotSent):
			// the confirm window frees only as the broker confirms, so a
			// window that stayed full is a destination or a broker that
			// confirms nothing, which the stall rules judge, and count.
			stopErr = fmt.Errorf("rabbitmq sink %s: not sent: %w", cfg.Name, ctx.Err())
			errs[i] = stopErr
			continue
		}
		tag := p.ch.GetNextPublishSeqNo()
		key := returnKey{cfg.Exchange, m.Destination, pubs[i].MessageId}
		p.mu.Lock()
		if p.isDead() {
			p.mu.Unlock()
			<-p.sem
			stopErr = p.deadErr(cfg)
			errs[i] = stopErr
			continue
		}
		p.pending[tag] = entry{b: b, i: i, key: key}
		b.left++
		p.mu.Unlock()

		dc, err := p.ch.PublishWithDeferredConfirm(cfg.Exchange, m.Destination, cfg.Mandatory, false, pubs[i])
		if err == nil {
			p.mu.Lock()
			if e, ok := p.pending[tag]; ok && e.b == b {
				e.dc = dc
				if e.confirmed {
					delete(p.pending, tag)
					p.settle(cfg, e)
				} else {
					p.pending[tag] = e
				}
			}
			p.mu.Unlock()
		}
		if err != nil {
			p.mu.Lock()
			if e, ok := p.pending[tag]; ok && e.b == b {
				delete(p.pending, tag)
				b.left--
				<-p.sem
			}
			p.mu.Unlock()
			var ae *amqp.Error
			if p.ch.IsClosed() || errors.Is(err, amqp.ErrClosed) || !errors.As(err, &ae) {
				// The channel or its connection is closing (a write
				// that failed shuts the connection down): its reason is
				// the publish's (dispatch sets it).
				select { // the library closes the confirms right after
				case <-p.dead:
				case <-ctx.Done():
				}
				stopErr = p.deadErr(cfg)
				errs[i] = stopErr
				continue
			}
			errs[i] = fmt.Errorf("rabbitmq sink %s: publish: %w", cfg.Name, err)
			continue
		}
		sent[i] = true
	}
	p.pubMu.Unlock()

	p.mu.Lock()
	b.left-- // the publisher's hold
	if b.left == 0 {
		close(b.done)
	}
	p.mu.Unlock()

	select {
	case <-b.done:
	case <-ctx.Done():
		p.mu.Lock()
		if b.left > 0 {
			b.abandoned = true
			for i := range msgs {
				if sent[i] && !b.resolved[i] {
					b.errs[i] = fmt.Errorf("rabbitmq sink %s: no publisher confirm yet: %w (fate unknown; published again)", cfg.Name, ctx.Err())
				}
			}
		}
		p.mu.Unlock()
	}
	p.mu.Lock()
	for i := range msgs {
		if sent[i] {
			errs[i] = b.errs[i]
		}
	}
	p.mu.Unlock()
}

func (p *pubChan) deadErr(cfg SinkParams) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		return fmt.Errorf("rabbitmq sink %s: not sent, channel closed", cfg.Name)
	}
	return fmt.Errorf("rabbitmq sink %s: not sent, %w", cfg.Name, p.err)
}

// toAMQP builds the publishing of m. AMQP short strings (routing key, header
// names, message_id) hold at most 255 bytes. Headers with a native value go
// out with their AMQP type, the others as strings; the kept properties go
// out as properties (user_id only when it is user, the sink's login).
func toAMQP(m sinks.Outgoing, user string) (amqp.Publishing, error) {
	if len(m.Destination) > 255 {
		return amqp.Publishing{}, sinks.Permanent(sinks.Because(sinks.ReasonInvalid, fmt.Errorf("routing key %.40q... is longer than 255 bytes", m.Destination)))
	}
	hs := m.OutHeaders(m.Attempt)
	table := make(amqp.Table, len(hs))
	for _, h := range hs {
		if len(h.Key) > 255 {
			return amqp.Publishing{}, sinks.Permanent(sinks.Because(sinks.ReasonInvalid, fmt.Errorf("header name %.40q... is longer than 255 bytes (AMQP limit)", h.Key)))
		}
		if _, dup := table[h.Key]; dup {
			continue // duplicate (Kafka) header: the first wins, as in Headers.Get
		}
		table[h.Key] = tableValue(h)
	}
	pub := amqp.Publishing{
		Headers:      table,
		Body:         m.Body,
		DeliveryMode: amqp.Persistent,
	}
	setProperties(&pub, m.Properties, user)
	// A longer ID still travels in the x-message-id header.
	if len(m.ID) <= 255 {
		pub.MessageId = m.ID
	}
	return pub, nil
}
