package scheduler

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/pkg/lifecycle"
	"github.com/delaybridge/delaybridge/pkg/logrepeat"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// failures says what went wrong with publishes (log.repeat_interval): a
// failed publish is counted in delaybridge_sink_publish_errors_total{sink,
// reason} and logged at WARN with its sink, destination, reason and the
// broker's words; a message that goes dead, or whose destination stalled,
// is logged likewise. Each kind of line is logged at most once per sink and
// destination per interval: in a flood (a thousand messages to an
// unroutable destination) the first is logged, the others are counted, and
// the count is said by the next line of that destination, or by a summary
// line once the interval ended (run). The destinations remembered are
// bounded (maxFailureKeys, logrepeat). A sink has at most perSinkLines
// lines of a kind per interval, whatever their destinations: with a
// subject per message (an entity's ID in it) each destination's first
// line was a line per message (2,000 a second while a stream was down);
// the others are counted in a line of the sink once the interval ended.
type failures struct {
	lim     *logrepeat.Limiter[line]
	log     *slog.Logger
	metrics *metrics.Metrics

	mu     sync.Mutex
	bySink map[string]*sinkLines // kind and sink -> this interval's lines
}

// sinkLines are the lines of one kind for one sink in an interval: how
// many were logged, how many not, and the last one not.
type sinkLines struct {
	from          time.Time
	logged, quiet int
	last          line
}

// perSinkLines bounds the lines of a kind for a sink per interval.
const perSinkLines = 16

// line is one log line: its message, its sink and attributes.
type line struct {
	msg, sink string
	args      []any
}

// maxFailureKeys bounds the (kind, sink, destination) keys the limiter
// remembers: past it the least recently failed is forgotten, and what it
// kept quiet is summed in a line of its own.
const maxFailureKeys = 4096

func newFailures(interval time.Duration, log *slog.Logger, m *metrics.Metrics) *failures {
	return &failures{lim: logrepeat.New[line](interval, maxFailureKeys), log: log, metrics: m, bySink: map[string]*sinkLines{}}
}

// published counts and logs the failures of one publish to sink (res[j] is
// the result of the message to dests[j]), at now.
func (f *failures) published(sink string, dests []string, res []error, now time.Time) {
	var counts map[sinks.Reason]int
	for j, err := range res {
		if err == nil {
			continue
		}
		reason := publishReason(err)
		if counts == nil {
			counts = map[sinks.Reason]int{}
		}
		counts[reason]++
		f.warn(now, "publish failed", sink, dests[j], "reason", string(reason), "err", err)
	}
	for reason, n := range counts {
		f.metrics.PublishErrors.WithLabelValues(sink, string(reason)).Add(float64(n))
	}
}

// publishReason is sinks.ReasonOf, but a publish cut off by the lease
// (errFenced after the publish began) is a timeout: not confirmed in time.
func publishReason(err error) sinks.Reason {
	if errors.Is(err, errFenced) {
		return sinks.ReasonTimeout
	}
	return sinks.ReasonOf(err)
}

// warn logs msg at WARN for sink and destination, unless a line of that
// msg was logged for them within the interval (then it is counted);
// not_logged is the count since the last line.
func (f *failures) warn(now time.Time, msg, sink, dest string, args ...any) {
	args = append([]any{"sink", sink, "destination", dest}, args...)
	l := line{msg: msg, sink: sink, args: args}
	ok, quiet := f.lim.Allow(msg+"\x00"+sink+"\x00"+dest, now, l)
	if !ok || !f.sinkAllows(now, l) {
		return
	}
	if quiet > 0 {
		args = append(args, "not_logged", quiet)
	}
	f.log.Warn(msg, args...)
}

// sinkAllows reports whether the sink has lines of l's kind left in this
// interval (perSinkLines); one that has not is counted (a destination's
// line so left out loses the count of its repeats it carried; a repeats
// summary so left out counts as one).
func (f *failures) sinkAllows(now time.Time, l line) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := l.msg + "\x00" + l.sink
	s := f.bySink[key]
	if s == nil {
		s = &sinkLines{from: now}
		f.bySink[key] = s
	}
	if s.logged < perSinkLines {
		s.logged++
		return true
	}
	s.quiet++
	s.last = l
	return false
}

// flushSinks logs, for each kind and sink whose interval ended with lines
// over perSinkLines, how many were not logged, with the last of them; and
// starts its next interval.
func (f *failures) flushSinks(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for key, s := range f.bySink {
		if now.Sub(s.from) < f.lim.Interval() {
			continue
		}
		if s.quiet > 0 {
			args := append(append([]any{}, s.last.args...), "not_logged", s.quiet, "within", f.lim.Interval(), "lines_per_sink", perSinkLines)
			f.log.Warn(s.last.msg+" (more destinations)", args...)
		}
		delete(f.bySink, key)
	}
}

// flush logs a summary of each destination whose interval ended with lines
// not logged: the last line's message and attributes, with not_logged and
// the interval; and the sinks' (flushSinks).
func (f *failures) flush(now time.Time) {
	f.flushSinks(now)
	due, other := f.lim.Due(now)
	for _, s := range due {
		args := append(append([]any{}, s.Last.args...), "not_logged", s.Quiet, "within", f.lim.Interval())
		if f.sinkAllows(now, line{msg: s.Last.msg + " (repeats)", sink: s.Last.sink, args: args}) {
			f.log.Warn(s.Last.msg+" (repeats)", args...)
		}
	}
	if other > 0 {
		f.log.Warn("failed publishes and dead messages not logged, of destinations too many to keep apart",
			"not_logged", other, "destinations_kept", maxFailureKeys)
	}
}

// run flushes every tick until ctx ends: a summary comes at most a tick
// after its interval ended. The ticker is the wall clock's, as
// refreshLoop's; the times are the scheduler's clock's, as the lines'.
func (f *failures) run(ctx context.Context, clock Clock) {
	tick := min(max(f.lim.Interval()/4, 10*time.Millisecond), time.Second)
	lifecycle.Every(ctx, tick, func() { f.flush(clock.Now()) })
}
