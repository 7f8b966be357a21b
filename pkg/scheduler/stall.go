package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// stalls tells a destination that never answers from a sink that is down
// (docs/reference.md, "The guarantee": one destination that never answers). A publish
// that timed out while its sink confirmed other messages (in the same
// publish, or within a publish timeout before) is the destination's fault:
// the sink is not blocked and its other messages go on. The first
// stallAttempts-1 such timeouts in a row of a destination are postponed
// without counting an attempt (a slow moment); from then on each counts, so
// that the message ends dead after max_attempts with the reason. A confirmed
// publish to the destination starts it over.
//
// A destination that stalled is suspect until it confirms again: its
// messages are published apart (Scheduler.detach), so that the messages to
// other destinations never wait behind it.
type stalls struct {
	timeout time.Duration // the publish timeout

	mu        sync.Mutex
	confirmed map[string]time.Time // sink -> its last confirmed publish
	row       map[sinkDest]int     // timeouts in a row while the sink confirmed others
}

// sinkDest is a sink and one of its destinations.
type sinkDest struct{ sink, dest string }

// stallAttempts is the timeouts in a row from which a stalling destination's
// timeouts count as attempts.
const stallAttempts = 3

func newStalls(timeout time.Duration) *stalls {
	return &stalls{timeout: timeout, confirmed: map[string]time.Time{}, row: map[sinkDest]int{}}
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
// last confirmation; a timeout while the sink confirmed others becomes a
// *stallError, which counts as an attempt (sinks.Rejected) from the
// stallAttempts-th in a row.
func (st *stalls) observe(sink string, start time.Time, dests []string, errs []error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	any := false
	for j, err := range errs {
		if err == nil {
			any = true
			delete(st.row, sinkDest{sink, dests[j]})
		}
	}
	if any {
		st.confirmed[sink] = time.Now()
	}
	answering := any || time.Since(st.confirmed[sink]) < 2*st.timeout
	if !answering {
		return // nothing of the sink answers: the sink is down (held as such)
	}
	for j, err := range errs {
		if err == nil || !timedOut(err) {
			continue
		}
		d := sinkDest{sink, dests[j]}
		st.row[d]++
		se := &stallError{sink: sink, dest: dests[j], row: st.row[d], timeout: st.timeout, err: err}
		if se.row >= stallAttempts {
			errs[j] = sinks.Rejected(se)
		} else {
			errs[j] = se
		}
	}
}

// timedOut reports whether a publish failed because its ctx (the publish
// timeout) ended before the broker answered.
func timedOut(err error) bool {
	return sinks.IsUnavailable(err) && errors.Is(err, context.DeadlineExceeded)
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
	return fmt.Sprintf("destination %q of sink %s did not answer within scheduler.publish_timeout %s (%d times in a row) while the sink confirmed other messages: %v",
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
// was confirmed.
func (p *pace) observe(sink string, d time.Duration, errs []error) {
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
