package rabbitbroker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// A publish the broker answers by closing the channel or the whole
// connection (541 INTERNAL_ERROR for a routing key amq.rabbitmq.reply-to.*
// that names no live consumer, a 404 or 406 for one message) fails every
// publish in flight with it, and no confirm says which one was at fault.
// Such a close is the message's fault, not the sink's (the contract's "A
// destination's faults are its own"): the publishes it cut off are
// suspects, published again apart, a group at a time, on a connection of
// their own (the quarantine) so that a second close hurts nobody else;
// a group the broker closes again is split in two, down to the one
// message that does it, which fails Rejected (an attempt, then dead with
// the reason). The others are published as if nothing happened. A
// destination found so (none of its messages went through) is remembered
// for a while (poisonTTL) and its messages are published in the quarantine
// only, so that its next attempts do not close the sink's connection again.

// closedError is the error of a publish whose channel or connection the
// broker closed (attributably: attributable) while it was unconfirmed or
// before it was sent: its fate is unknown, and it may be the cause. lost
// marks a connection that ended on a read or write error instead (lost):
// the broker may have closed it for a publish, its close unread, or the
// network failed; such a publish is tried again apart, but a close of the
// same kind never makes it the culprit.
type closedError struct {
	err  error
	lost bool
}

func (e *closedError) Error() string { return e.err.Error() }
func (e *closedError) Unwrap() error { return e.err }

// suspect reports whether err is a closedError: a publish to try again in
// the quarantine.
func suspect(err error) bool {
	var c *closedError
	return errors.As(err, &c)
}

// attributable reports whether the broker closed a channel or connection
// for something a publish on it did, rather than for the sink: a close the
// broker sent (not a network failure nor our own Close), other than 320
// CONNECTION_FORCED (an operator, or a broker stopping), 404 for a missing
// exchange (the sink's, for every message) and a 403 that is not about a
// topic (the user may not write the exchange at all).
func attributable(err error) bool {
	var e *amqp.Error
	if !errors.As(err, &e) || !e.Server {
		return false
	}
	switch e.Code {
	case amqp.ConnectionForced:
		return false
	case amqp.NotFound:
		return !strings.Contains(e.Reason, "no exchange")
	case amqp.AccessRefused:
		return strings.Contains(e.Reason, "topic")
	}
	return true
}

// lost reports whether err is a connection that ended on a read or write
// error other than a timeout (amqp091-go's 501 of its own: a reset, a
// broken pipe, EOF). When the broker closes the connection for a publish
// while other publishes are being written, a write can fail on the reset
// socket before the broker's close is read, and this is all the client
// learns. A timeout (a missed heartbeat, a network that drops packets)
// says the broker is not answering: the sink is down.
func lost(err error) bool {
	var e *amqp.Error
	return errors.As(err, &e) && !e.Server && e.Code == amqp.FrameError && !strings.Contains(strings.ToLower(e.Reason), "timeout")
}

// closeReason names the close of a channel or connection the broker
// answered a publish with: 403 is the destination's permission, 404 a
// name that does not exist (a reply-to queue), 406 for a body over the
// broker's max_message_size its size, the rest (541...) a refusal.
func closeReason(err error) sinks.Reason {
	switch Code(err) {
	case amqp.AccessRefused:
		return sinks.ReasonUnauthorized
	case amqp.NotFound:
		return sinks.ReasonNotFound
	case amqp.PreconditionFailed:
		var e *amqp.Error
		if errors.As(err, &e) && strings.Contains(e.Reason, "message size") {
			return sinks.ReasonTooLarge
		}
	}
	return sinks.ReasonRejected
}

const (
	// poisonTTL is how long a destination whose publish made the broker
	// close the channel or connection is published in the quarantine only.
	poisonTTL = 10 * time.Minute
	// maxPoison bounds the destinations remembered; the oldest go first.
	maxPoison = 1024
	// maxProbes bounds the groups one isolation publishes: past it, the
	// suspects left fail as they did (the sink's, published again later).
	maxProbes = 64
	// quickReconnect bounds how long Publish waits for the connection that
	// the broker closed for a publish to be reopened (at once, no back-off).
	quickReconnect = 5 * time.Second
)

// quarantine is the sink's own connection for suspects and the
// destinations that closed a channel or connection. One group is
// published at a time (mu).
type quarantine struct {
	mu   sync.Mutex
	conn *amqp.Connection
	ch   *pubChan

	pmu    sync.Mutex
	poison map[string]time.Time // routing key -> when it last closed a channel or connection
}

// poisoned reports whether the broker closed a channel or connection for
// a publish to routing key dest within poisonTTL.
func (q *quarantine) poisoned(dest string, now time.Time) bool {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	at, ok := q.poison[dest]
	return ok && now.Sub(at) < poisonTTL
}

// mark records dest as poisoned, or forgets it.
func (q *quarantine) mark(dest string, bad bool, now time.Time) {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	if !bad {
		delete(q.poison, dest)
		return
	}
	if q.poison == nil {
		q.poison = map[string]time.Time{}
	}
	if _, ok := q.poison[dest]; !ok && len(q.poison) >= maxPoison {
		oldest, at := "", now
		for d, t := range q.poison {
			if t.Before(at) {
				oldest, at = d, t
			}
		}
		delete(q.poison, oldest)
	}
	q.poison[dest] = now
}

// quarantineChan returns the quarantine's live channel, dialing the connection
// or opening the channel again when the broker closed it (q.mu held).
func (s *Sink) quarantineChan(ctx context.Context) (*pubChan, error) {
	q := &s.quarantine
	if q.ch != nil && !q.ch.isDead() {
		return q.ch, nil
	}
	if q.conn == nil || q.conn.IsClosed() {
		if q.conn != nil {
			_ = q.conn.CloseDeadline(time.Now().Add(time.Second))
		}
		conn, err := Dial(ctx, s.cfg.URL, "delaybridge sink "+s.cfg.Name+" (quarantine)", s.cfg.Auth)
		if err != nil {
			q.conn = nil
			return nil, err
		}
		q.conn = conn
	}
	ch, err := s.openChan(q.conn)
	if err != nil {
		_ = q.conn.CloseDeadline(time.Now().Add(time.Second))
		q.conn = nil
		return nil, err
	}
	q.ch = ch
	return ch, nil
}

// closeQuarantine closes the quarantine's connection.
func (s *Sink) closeQuarantine() {
	q := &s.quarantine
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.conn != nil {
		_ = q.conn.CloseDeadline(time.Now().Add(time.Second))
		q.conn, q.ch = nil, nil
	}
}

// isolate publishes the suspects idx of msgs again in the quarantine,
// filling their errs: nil when confirmed, Rejected for a message the broker
// closes the channel or connection for, the suspect's error left as it was
// when the quarantine cannot tell (not connected, ctx ended, maxProbes
// reached). Messages to a poisoned destination are tried alone first. A
// destination none of whose messages was confirmed while one of them made
// the broker close is poisoned; one whose message was confirmed is not.
func (s *Sink) isolate(ctx context.Context, msgs []sinks.Outgoing, pubs []amqp.Publishing, errs []error, idx []int) {
	q := &s.quarantine
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	var alone, rest []int
	for _, i := range idx {
		if q.poisoned(msgs[i].Destination, now) {
			alone = append(alone, i)
		} else {
			rest = append(rest, i)
		}
	}
	// Messages to one destination side by side: a destination at fault
	// (a routing key) is then found in few halvings.
	slices.SortStableFunc(rest, func(a, b int) int { return strings.Compare(msgs[a].Destination, msgs[b].Destination) })
	budget := maxProbes
	var culprits []int
	for _, i := range alone {
		culprits = s.bisect(ctx, msgs, pubs, errs, []int{i}, &budget, culprits)
	}
	culprits = s.bisect(ctx, msgs, pubs, errs, rest, &budget, culprits)

	now = time.Now()
	confirmed := map[string]bool{}
	for _, i := range idx {
		if errs[i] == nil {
			confirmed[msgs[i].Destination] = true
		}
	}
	for d := range confirmed {
		q.mark(d, false, now)
	}
	for _, i := range culprits {
		if d := msgs[i].Destination; !confirmed[d] {
			q.mark(d, true, now)
		}
	}
}

// bisect publishes the messages units together; when the broker closes the
// channel or connection, those still unconfirmed are split in two and
// published again, down to one message alone, which is the cause: its
// error becomes Rejected, and it is added to culprits (q.mu held).
func (s *Sink) bisect(ctx context.Context, msgs []sinks.Outgoing, pubs []amqp.Publishing, errs []error, units []int, budget *int, culprits []int) []int {
	if len(units) == 0 || *budget <= 0 || ctx.Err() != nil {
		return culprits
	}
	*budget--
	ch, err := s.quarantineChan(ctx)
	if err != nil {
		s.log.Debug("rabbitmq sink quarantine not connected", "err", err)
		return culprits
	}
	sub := make([]sinks.Outgoing, len(units))
	subPubs := make([]amqp.Publishing, len(units))
	subErrs := make([]error, len(units))
	for k, i := range units {
		sub[k], subPubs[k] = msgs[i], pubs[i]
	}
	ch.publish(ctx, s.cfg, sub, subPubs, subErrs)
	var left []int
	for k, i := range units {
		if suspect(subErrs[k]) {
			left = append(left, i) // its error stays the first close's
			continue
		}
		errs[i] = keepSent(errs[i], subErrs[k])
	}
	switch {
	case len(left) == 0:
		return culprits
	case len(units) == 1 && isLost(subErrs[0]):
		// Alone, and the connection was lost: nothing says it was this
		// message; it fails as the sink's (published again later).
		errs[units[0]] = keepSent(errs[units[0]], subErrs[0])
		return culprits
	case len(units) == 1:
		// Alone, and the broker closed again: its fault.
		i := units[0]
		why := unwrapClosed(subErrs[0])
		// Debug: the scheduler logs the failed publish at WARN with its
		// reason, at most once per destination per log.repeat_interval.
		s.log.Debug("rabbitmq sink: the broker closes the channel or connection when this message is published; "+
			"it fails (an attempt) and is published apart from the others", "id", msgs[i].ID, "exchange", s.cfg.Exchange,
			"routing_key", msgs[i].Destination, "err", why)
		errs[i] = sinks.Rejected(sinks.Because(closeReason(why), fmt.Errorf("rabbitmq sink %s: the broker closed the channel when the message was published to routing key %q on exchange %q: %w",
			s.cfg.Name, msgs[i].Destination, s.cfg.Exchange, why)))
		return append(culprits, i)
	case len(left) == 1:
		return s.bisect(ctx, msgs, pubs, errs, left, budget, culprits)
	}
	half := len(left) / 2
	culprits = s.bisect(ctx, msgs, pubs, errs, left[:half], budget, culprits)
	return s.bisect(ctx, msgs, pubs, errs, left[half:], budget, culprits)
}

// isLost reports whether err is a closedError of a lost connection.
func isLost(err error) bool {
	var c *closedError
	return errors.As(err, &c) && c.lost
}

// unwrapClosed is the broker's close of a suspect's error (the
// *amqp.Error), or err.
func unwrapClosed(err error) error {
	var e *amqp.Error
	if errors.As(err, &e) {
		return e
	}
	return err
}

// keepSent is the error of a message published again apart (next) after
// its first publish failed (first): a first copy that may have reached
// the broker (sinks.Sent) still may, whatever became of the second, unless
// the second was confirmed.
func keepSent(first, next error) error {
	if next != nil && sinks.IsSent(first) && !sinks.IsSent(next) {
		return sinks.Sent(next)
	}
	return next
}
