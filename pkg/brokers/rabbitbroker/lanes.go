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

// A queue that takes no publish (a quorum queue without its quorum, a
// queue process that hangs) confirms nothing, and RabbitMQ's flow control
// then stops the channel that sends to it and, once the channel's credit
// is spent, the whole connection: every publish on it waits, to any queue,
// and so does a channel opened on it. So:
//   - a channel of the pool that got no answer to any publish during one
//     that waited out its time (stuckAfter at least), or a connection
//     whose write is still blocked a second after a publish's time and
//     that opens no channel within a second, is taken down (abandon): the
//     sink reconnects at once, the publishes that timed out count for
//     their destinations' stalls (the scheduler then publishes those
//     destinations apart), and those cut off on the other channels fail
//     sinks.Again (published again soon, not counted); not while the
//     broker blocks the connection for a resource alarm, which is the
//     sink's;
//   - the messages the scheduler publishes apart (sinks.IsApart: their
//     destination stalled) go on a connection of their destination's own,
//     a lane, up to maxLanes at once (those beyond share one more, closed
//     when a publish on it gets no answer); a lane of its own that has had
//     a publish unanswered for stuckAfter is kept, and sends nothing more
//     until the broker answers on it again (its next publishes wait their
//     time for that, then fail as timeouts, which count for the
//     destination; those woken with less than stuckAfter left are not
//     sent, published again soon; once answered, it sends one publish at
//     a time until one is answered in full), so that a stopped queue gets
//     a few seconds of copies, not a batch per attempt, nor all its
//     waiting publishes at its first answer; one unused for laneIdle
//     is closed when a lane is next asked for; a lane that cannot connect
//     leaves its messages to the pool;
//   - Probe asks on a connection of its own, which publishes nothing, so
//     that a connection stopped so is not taken for a broker down (on the
//     sink's when the broker refuses one more).
//
// What was sent on a connection closed so, or on a lane that got no
// answer, may still reach its queue when the queue takes publishes again:
// a copy of each message then in flight.

const (
	// stuckAfter is the least time a publish waits with no answer on its
	// channel before its connection is taken for stopped: a broker that
	// takes publishes confirms within milliseconds.
	stuckAfter = 2 * time.Second
	// maxLanes bounds the destinations with a connection of their own.
	maxLanes = 16
	// laneIdle is how long an unused lane stays open.
	laneIdle = time.Minute
)

// lane is the connection of one destination's messages published apart.
type lane struct {
	mu   sync.Mutex // conn, ch and unanswered
	conn *amqp.Connection
	ch   *pubChan
	// unanswered is when the first publish on ch began that the broker
	// has not answered anything since; zero when none.
	unanswered time.Time
	// careful: the lane was held, and sends one publish at a time until
	// one is answered in full.
	careful bool
	used    time.Time // lanes.mu
}

// lanes are a sink's lanes by destination, and the one the destinations
// beyond maxLanes share.
type lanes struct {
	mu     sync.Mutex
	by     map[string]*lane
	shared lane
}

// close closes the lane's connection at once (l.mu held): a broker that
// reads nothing more of it would not answer a close.
func (l *lane) close() {
	if l.conn != nil {
		_ = l.conn.CloseDeadline(time.Now())
	}
	l.conn, l.ch, l.unanswered, l.careful = nil, nil, time.Time{}, false
}

// lane returns dest's lane, made if need be, after closing the lanes
// unused for laneIdle; nil when maxLanes others are in use.
func (s *Sink) lane(dest string, now time.Time) *lane {
	ls := &s.lanes
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for d, l := range ls.by {
		if d != dest && now.Sub(l.used) > laneIdle && l.mu.TryLock() {
			l.close()
			l.mu.Unlock()
			delete(ls.by, d)
		}
	}
	l := ls.by[dest]
	if l == nil {
		if len(ls.by) >= maxLanes {
			return nil
		}
		if ls.by == nil {
			ls.by = map[string]*lane{}
		}
		l = &lane{}
		ls.by[dest] = l
	}
	l.used = now
	return l
}

// closeLanes closes every lane.
func (s *Sink) closeLanes() {
	ls := &s.lanes
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for d, l := range ls.by {
		l.mu.Lock()
		l.close()
		l.mu.Unlock()
		delete(ls.by, d)
	}
	ls.shared.mu.Lock()
	ls.shared.close()
	ls.shared.mu.Unlock()
}

// publishApart publishes msgs (those whose errs are nil) on their
// destinations' lanes, each destination's at the same time as the others',
// filling errs; a destination whose lane cannot connect is published on
// p, a channel of the pool. What a lane's connection failed for other
// than the publish's time is sinks.Again: a lane is no sign of the sink's
// broker being down.
func (s *Sink) publishApart(ctx context.Context, p *pubChan, msgs []sinks.Outgoing, pubs []amqp.Publishing, errs []error) {
	byDest := map[string][]int{}
	for i, m := range msgs {
		if errs[i] == nil {
			byDest[m.Destination] = append(byDest[m.Destination], i)
		}
	}
	now := time.Now()
	var wg sync.WaitGroup
	for dest, idx := range byDest {
		sub := make([]sinks.Outgoing, len(idx))
		subPubs := make([]amqp.Publishing, len(idx))
		subErrs := make([]error, len(idx))
		for k, i := range idx {
			sub[k], subPubs[k] = msgs[i], pubs[i]
		}
		l, name := s.lane(dest, now), dest
		if l == nil {
			l, name = &s.lanes.shared, "the others"
		}
		wg.Go(func() {
			if err := s.publishLane(ctx, l, name, sub, subPubs, subErrs); err != nil {
				s.log.Debug("rabbitmq sink: no connection apart; publishing on the sink's", "routing_key", name, "err", err)
				s.publishPool(ctx, p, sub, subPubs, subErrs)
			} else {
				for k, err := range subErrs {
					if sinks.IsUnavailable(err) && !errors.Is(err, context.DeadlineExceeded) && !suspect(err) {
						subErrs[k] = sinks.Again(err)
					}
				}
			}
			for k, i := range idx {
				errs[i] = subErrs[k]
			}
		})
	}
	wg.Wait()
}

// publishLane publishes msgs on l, dialing its connection if need be
// (its error when it cannot, errs untouched). Publishes on one lane may
// run at the same time (the channel serializes their writes).
func (s *Sink) publishLane(ctx context.Context, l *lane, dest string, msgs []sinks.Outgoing, pubs []amqp.Publishing, errs []error) error {
	l.mu.Lock()
	if l.ch == nil || l.ch.isDead() {
		l.close()
		if s.closed.Load() {
			l.mu.Unlock()
			return errors.New("closed")
		}
		name := fmt.Sprintf("delaybridge sink %s (apart: %.64s)", s.cfg.Name, dest)
		conn, err := Dial(ctx, s.cfg.URL, name, s.cfg.Auth)
		if err == nil {
			var ch *pubChan
			if ch, err = s.openChan(conn); err == nil {
				l.conn, l.ch = conn, ch
			} else {
				_ = conn.CloseDeadline(time.Now().Add(time.Second))
			}
		}
		if err != nil {
			l.mu.Unlock()
			return err
		}
	}
	conn, ch := l.conn, l.ch
	shared := l == &s.lanes.shared
	careful := false
	laneClosed := func() {
		sinks.Fill(errs, sinks.NotSent(fmt.Errorf("rabbitmq sink %s: not sent: the connection apart for routing key %q closed while the publish waited for it", s.cfg.Name, dest)))
	}
	for {
		// Held: the lane has sent what its destination took no answer
		// for stuckAfter, or, once it was so, a publish still unanswered
		// (one at a time until one is answered in full): nothing more is
		// sent until the broker answers.
		since := l.unanswered
		if !since.IsZero() && ch.answeredAt.Load() >= since.UnixNano() {
			since = time.Time{} // answered since
		}
		held := !shared && !since.IsZero() && (l.careful || time.Since(since) >= stuckAfter)
		if !held {
			if since.IsZero() {
				since = time.Now()
			}
			l.unanswered, careful = since, l.careful
			l.mu.Unlock()
			break
		}
		l.careful = true
		l.mu.Unlock()
		switch err := ch.awaitAnswer(ctx, since); {
		case errors.Is(err, errLaneDead):
			laneClosed()
			return nil
		case err != nil:
			sinks.Fill(errs, fmt.Errorf("rabbitmq sink %s: not sent: routing key %q has taken no publish on its connection apart since %s "+
				"(a queue that takes no publish: a quorum queue without its quorum?): %w", s.cfg.Name, dest, since.Format(time.RFC3339), context.DeadlineExceeded))
			return nil
		case sinks.Left(ctx) < stuckAfter:
			// Answered again with little of its time left: published
			// again soon, in full time, rather than into the time it has
			// left.
			sinks.Fill(errs, sinks.NotSent(fmt.Errorf("rabbitmq sink %s: not sent: routing key %q answers again; published again soon", s.cfg.Name, dest)))
			return nil
		}
		l.mu.Lock()
		if l.ch != ch {
			l.mu.Unlock()
			laneClosed()
			return nil
		}
	}
	start := time.Now()
	var blockedWrite atomic.Bool
	stop := guard(ctx, func() {
		if !s.isBlocked() && !opens(conn) {
			blockedWrite.Store(true)
			_ = conn.CloseDeadline(time.Now())
		}
	})
	ch.publish(ctx, s.cfg, msgs, pubs, errs)
	stop()
	if blockedWrite.Load() {
		timedOutWriting(s.cfg.Name, errs)
	}
	if careful && !slices.ContainsFunc(errs, func(err error) bool { return err != nil }) {
		l.mu.Lock()
		if l.ch == ch {
			l.careful = false // answered in full: publishes go side by side again
		}
		l.mu.Unlock()
	}
	if shared && ch.stuck(start, errs) {
		// Shared by destinations that did not stall together: closed, not
		// held, so that one of them taking nothing does not stop the
		// others' next publishes.
		l.mu.Lock()
		if l.ch == ch {
			l.close()
		}
		l.mu.Unlock()
	}
	return nil
}

// errLaneDead is awaitAnswer's error for a lane closed while it waited.
var errLaneDead = errors.New("the lane closed")

// timedOutWriting makes the errors of a publish whose write was still
// blocked a second after its time, and whose connection was closed for
// it, timeouts: they count for their destinations, so that a message whose
// write never ends cannot go round for good uncounted.
func timedOutWriting(sink string, errs []error) {
	for i, err := range errs {
		if sinks.IsUnavailable(err) && !errors.Is(err, context.DeadlineExceeded) {
			errs[i] = fmt.Errorf("rabbitmq sink %s: the write did not end within the publish's time (%w): %w", sink, context.DeadlineExceeded, err)
		}
	}
}

// publishPool publishes msgs on p, a channel of the pool, and takes its
// connection down when the broker answered nothing on p meanwhile
// (abandon).
func (s *Sink) publishPool(ctx context.Context, p *pubChan, msgs []sinks.Outgoing, pubs []amqp.Publishing, errs []error) {
	start := time.Now()
	var blockedWrite atomic.Bool
	stop := guard(ctx, func() {
		if !s.isBlocked() && !opens(p.conn) {
			blockedWrite.Store(true)
			s.abandon(p, time.Since(start))
		}
	})
	p.publish(ctx, s.cfg, msgs, pubs, errs)
	stop()
	if p.stuck(start, errs) {
		s.abandon(p, time.Since(start))
	}
	if blockedWrite.Load() {
		timedOutWriting(s.cfg.Name, errs)
	}
	s.cutOff(p, errs)
}

// opens reports whether the broker answers a channel opened on conn
// within a second: a connection whose writes are slow but go on does; one
// the broker reads nothing of does not.
func opens(conn *amqp.Connection) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return wait(ctx, func() error {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		return ch.Close()
	}) == nil
}

// guard calls closeConn when the publish it guards has not returned a
// second after ctx's deadline: a write blocks while the broker reads
// nothing of the connection (flow control) and its socket's buffers are
// full, and only closing the connection ends it. stop ends the guard.
func guard(ctx context.Context, closeConn func()) (stop func()) {
	dl, ok := ctx.Deadline()
	if !ok {
		return func() {}
	}
	t := time.AfterFunc(time.Until(dl)+time.Second, closeConn)
	return func() { t.Stop() }
}

// isBlocked reports whether the broker blocks the sink's connection (a
// resource alarm): its publishes wait, which is the sink's, not a
// connection to take down.
func (s *Sink) isBlocked() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blocked != nil
}

// abandon closes the pool's connection p is a channel of, when it is the
// sink's current one, for the broker answered nothing on p for as long as
// waited: the sink reconnects at once (supervise), and the publishes cut
// off on its other channels fail sinks.Again (cutOff).
func (s *Sink) abandon(p *pubChan, waited time.Duration) {
	s.mu.Lock()
	if s.conn != p.conn || s.abandoned == p.conn || s.blocked != nil {
		s.mu.Unlock()
		return
	}
	s.abandoned, s.quick = p.conn, true
	s.mu.Unlock()
	s.log.Warn("rabbitmq sink: the broker answered no publish on a channel for as long as a publish waited; "+
		"a queue that takes no publish (a quorum queue without its quorum) stops the connection that sends to it (flow control): "+
		"reconnecting, and publishing the destinations that did not answer on connections of their own", "waited", waited.Round(time.Millisecond))
	_ = p.conn.CloseDeadline(time.Now())
}

// cutOff makes the errors of a publish on p that its connection's abandon
// cut off (not those that waited out their time, which count for their
// destinations) sinks.Again.
func (s *Sink) cutOff(p *pubChan, errs []error) {
	s.mu.Lock()
	abandoned := s.abandoned == p.conn
	s.mu.Unlock()
	if !abandoned {
		return
	}
	for i, err := range errs {
		if sinks.IsUnavailable(err) && !errors.Is(err, context.DeadlineExceeded) && !suspect(err) {
			errs[i] = sinks.Again(err)
		}
	}
}
