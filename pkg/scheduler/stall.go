package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// stalls tells a destination that never answers from a sink that is down
// (docs/operations.md, "A destination that never answers"). A publish that
// timed out while its sink answered otherwise is the destination's fault:
// the sink is not blocked and its other messages go on. The sink answers
// when it confirmed other messages after the publish that timed out began
// (in the same publish, or another under way meanwhile); when it confirmed
// none since (little traffic beside the destination; or its broker stopped
// answering, a server paused or a network cut, after its last
// confirmation), it is asked whether its broker answers (sinks.Prober),
// and an answer counts for the publishes begun before it. Without that
// question a timeout with nothing confirmed was taken for the sink being
// down: held without counting an attempt, the sink blocked for a back-off
// that doubled each time, so the message was published again and again
// without ever ending dead, and the sink's other messages, once they came
// due, waited out the block.
//
// The first stallAttempts-1 such timeouts in a row of a destination are
// postponed without counting an attempt (a slow moment); from then on each
// counts, so that the message ends dead after max_attempts with the
// reason: it is published at most max_attempts + stallAttempts-1 times. A
// confirmed publish to the destination starts it over. A timeout while
// the sink does not answer (nothing confirmed lately, and a probe that
// failed, or a sink that cannot be probed) is the sink's: held, without
// counting.
//
// A destination that stalled is suspect until it confirms again: its
// messages are published apart (Scheduler.detach), so that the messages to
// other destinations never wait behind it.
type stalls struct {
	timeout time.Duration // the publish timeout
	clock   Clock
	sinks   map[string]sinks.Sink

	mu        sync.Mutex
	confirmed map[string]time.Time  // sink -> when it last answered: a confirmed publish, or a probe
	row       map[sinkDest]int      // timeouts in a row while the sink answered
	probes    map[string]*probeLock // sink -> its probes, one at a time
}

// sinkDest is a sink and one of its destinations.
type sinkDest struct{ sink, dest string }

// probeLock serialises the probes of one sink, and keeps the time of the
// last that failed: the publishes that time out at once while a sink is
// down ask it once, not each.
type probeLock struct {
	mu     sync.Mutex
	failed time.Time
}

// stallAttempts is the timeouts in a row from which a stalling destination's
// timeouts count as attempts.
const stallAttempts = 3

// probeTimeout bounds a probe (less when the publish timeout is shorter):
// a broker that answers does so in milliseconds.
const probeTimeout = 2 * time.Second

func newStalls(timeout time.Duration, clock Clock, sk map[string]sinks.Sink) *stalls {
	return &stalls{timeout: timeout, clock: clock, sinks: sk,
		confirmed: map[string]time.Time{}, row: map[sinkDest]int{}, probes: map[string]*probeLock{}}
}

// suspect reports whether the destination stalled and has not confirmed
// since.
func (st *stalls) suspect(sink, dest string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.row[sinkDest{sink, dest}] > 0
}

// observe classifies the results of one publish to sink, made at start:
// confirmed messages start their destinations over and date the sink's
// last answer; a timeout while the sink answered becomes a *stallError,
// which counts as an attempt (sinks.Rejected) from the stallAttempts-th in
// a row. When nothing of the sink was confirmed lately, the sink is
// probed first (answers), which may take up to probeTimeout.
func (st *stalls) observe(sink string, start time.Time, dests []string, errs []error) {
	now := st.clock.Now()
	st.mu.Lock()
	any := false
	for j, err := range errs {
		if err == nil {
			any = true
			delete(st.row, sinkDest{sink, dests[j]})
		}
	}
	if any {
		st.confirmed[sink] = now
	}
	answering := any || st.answered(sink, start) // a confirmation in this publish came after its start
	st.mu.Unlock()
	if !answering && slices.ContainsFunc(errs, timedOut) {
		answering = st.answers(sink, start)
	}
	if !answering {
		return // nothing of the sink answers: the sink is down (held as such)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	// A publish is one timeout in a row of each destination that timed out
	// in it, however many of its messages went there: fifty messages of one
	// batch that time out together are one slow moment, not fifty.
	counted := map[sinkDest]bool{}
	for j, err := range errs {
		if err == nil || !timedOut(err) {
			continue
		}
		d := sinkDest{sink, dests[j]}
		if !counted[d] {
			counted[d] = true
			st.row[d]++
		}
		se := &stallError{sink: sink, dest: dests[j], row: st.row[d], timeout: st.timeout, err: err}
		if se.row >= stallAttempts {
			errs[j] = sinks.Rejected(se)
		} else {
			errs[j] = se
		}
	}
}

// answered reports whether the sink answered after since, the start of
// the publish that timed out: a confirmation from before it says nothing
// of a broker that stopped answering meanwhile (a server paused, a network
// cut), whose publishes all time out after the last one it confirmed.
// st.mu is held.
func (st *stalls) answered(sink string, since time.Time) bool {
	at, ok := st.confirmed[sink]
	return ok && at.After(since)
}

// answers asks the sink whether its broker answers now (sinks.Prober),
// one probe at a time per sink: a caller that waited for another's probe
// takes its answer when it came after since. A sink that cannot be probed
// does not answer. A probe that failed is not repeated for a publish
// timeout (the sink is blocked meanwhile anyway).
func (st *stalls) answers(sink string, since time.Time) bool {
	p, ok := st.sinks[sink].(sinks.Prober)
	if !ok {
		return false
	}
	st.mu.Lock()
	pl := st.probes[sink]
	if pl == nil {
		pl = &probeLock{}
		st.probes[sink] = pl
	}
	st.mu.Unlock()
	pl.mu.Lock()
	defer pl.mu.Unlock()
	now := st.clock.Now()
	st.mu.Lock()
	answered := st.answered(sink, since)
	st.mu.Unlock()
	switch {
	case answered:
		return true // confirmed, or probed, while this one waited
	case !pl.failed.IsZero() && now.Sub(pl.failed) < st.timeout:
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(st.timeout, probeTimeout))
	err := p.Probe(ctx)
	cancel()
	now = st.clock.Now()
	if err != nil {
		pl.failed = now
		return false
	}
	st.mu.Lock()
	st.confirmed[sink] = latest(st.confirmed[sink], now)
	st.mu.Unlock()
	return true
}

// timedOut reports whether a publish failed because its ctx (the publish
// timeout) ended before the broker answered.
func timedOut(err error) bool {
	return sinks.IsUnavailable(err) && errors.Is(err, context.DeadlineExceeded)
}

// waitedOut reports whether a publish failed because its time ran out: the
// publish timeout (as the sink reported it, or as observe classified it),
// the lease, or a message its sink did not send for its time being over.
func waitedOut(err error) bool {
	return timedOut(err) || errors.As(err, new(*stallError)) || errors.Is(err, errFenced) ||
		(sinks.IsNotSent(err) && errors.Is(err, context.DeadlineExceeded))
}

// stallError is a publish to a destination that did not answer within the
// publish timeout while its sink confirmed others.
type stallError struct {
	sink, dest string
	row        int
	timeout    time.Duration
	err        error
}

func (e *stallError) Error() string {
	return fmt.Sprintf("destination %q of sink %s did not answer within scheduler.publish_timeout %s (%d times in a row) while the sink answered (other messages confirmed, or its broker a probe): %v",
		e.dest, e.sink, e.timeout, e.row, e.err)
}

func (e *stallError) Unwrap() error { return e.err }

// postponed reports whether err is a stall that does not count as an
// attempt yet.
func postponed(err error) bool {
	var se *stallError
	return errors.As(err, &se) && !sinks.IsRejected(err)
}

// pace keeps each sink's usual publish duration, from which a publish
// that takes much longer is left to settle on its own (grace).
type pace struct {
	mu   sync.Mutex
	ewma map[string]time.Duration // sink -> moving average of confirmed publishes
}

// The bounds of a publish's grace: never less than graceMin (a scheduler
// pause, a GC), never more than graceMax, and graceFactor times the sink's
// usual duration between.
const (
	graceMin    = 20 * time.Millisecond
	graceMax    = time.Second
	graceFactor = 8
)

func newPace() *pace { return &pace{ewma: map[string]time.Duration{}} }

// observe takes the duration of a publish of which at least one message
// was confirmed and none waited out its time: one that waited out the
// publish timeout for a destination that never answers (or the lease) says
// nothing of the sink's pace.
func (p *pace) observe(sink string, d time.Duration, errs []error) {
	if slices.ContainsFunc(errs, waitedOut) {
		return
	}
	for _, err := range errs {
		if err == nil {
			p.mu.Lock()
			if old, ok := p.ewma[sink]; ok {
				d = old + (d-old)/8
			}
			p.ewma[sink] = d
			p.mu.Unlock()
			return
		}
	}
}

// grace is how long a publish to sink is waited for before it is left to
// settle on its own.
func (p *pace) grace(sink string) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return min(max(graceFactor*p.ewma[sink], graceMin), graceMax)
}
