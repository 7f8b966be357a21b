package logrepeat

import (
	"context"
	"log/slog"
	"time"
)

// Warner logs one kind of WARN line through a Limiter: the first of a key
// within the interval, the others counted, and a summary line ("msg
// (repeats)", with not_logged and within) for each key whose interval
// ended with some not logged. Create it with NewWarner.
type Warner struct {
	lim *Limiter[[]any]
	log *slog.Logger
	msg string
}

// NewWarner returns a Warner of the line msg on log, at most once per key
// per interval (0: every line), remembering at most keys keys.
func NewWarner(log *slog.Logger, msg string, interval time.Duration, keys int) *Warner {
	return &Warner{lim: New[[]any](interval, keys), log: log, msg: msg}
}

// Warn logs the line with args for key at now, unless one was logged for
// key within the interval (then it is counted); not_logged is the count
// since the last line.
func (w *Warner) Warn(key string, now time.Time, args ...any) {
	ok, quiet := w.lim.Allow(key, now, args)
	if !ok {
		return
	}
	if quiet > 0 {
		args = append(args, "not_logged", quiet)
	}
	w.log.Warn(w.msg, args...)
}

// Flush logs the summary of each key whose interval ended by now with
// lines not logged (the last one's args), and of those of keys forgotten
// to stay within keys.
func (w *Warner) Flush(now time.Time) {
	due, other := w.lim.Due(now)
	for _, d := range due {
		w.log.Warn(w.msg+" (repeats)", append(append([]any{}, d.Last...), "not_logged", d.Quiet, "within", w.lim.Interval())...)
	}
	if other > 0 {
		w.log.Warn(w.msg+" (repeats of keys too many to keep apart)", "not_logged", other)
	}
}

// Run flushes every quarter interval (10 ms to a second) until ctx ends,
// then flushes what the last interval kept quiet; now gives the time.
// With no interval it returns at once.
func (w *Warner) Run(ctx context.Context, now func() time.Time) {
	d := w.lim.Interval()
	if d <= 0 {
		return
	}
	t := time.NewTicker(min(max(d/4, 10*time.Millisecond), time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			w.Flush(now().Add(d))
			return
		case <-t.C:
			w.Flush(now())
		}
	}
}
