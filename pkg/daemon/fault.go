//go:build !faultinject

package daemon

import (
	"log/slog"
	"time"

	"github.com/delaybridge/delaybridge/pkg/ingest"

	"github.com/delaybridge/delaybridge/pkg/scheduler"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// localClock is this process's own clock: the one store.Clock corrects to
// Redis's, and the scheduler's (its timers, back-offs and sink back-offs).
// It is the wall clock. A binary built with the tag faultinject can read a
// skewed one instead (fault_faultinject.go), for the fault suite; skew
// is then how far it is off.
func localClock() (now func() time.Time, sched scheduler.Clock, skew time.Duration) {
	return time.Now, scheduler.SystemClock{}, 0
}

// faultSource is src. A binary built with the tag faultinject can hold the
// acknowledgements of every ingest instead (fault_faultinject.go), so that
// a test kills it between parking and acknowledging.
func faultSource(src ingest.Source, _ *slog.Logger) ingest.Source { return src }

// faultSink is s. A binary built with the tag faultinject can stamp every
// message it publishes with the time its publish began instead
// (fault_faultinject.go), so that a test tells a late publish from a
// broker late to store it.
func faultSink(s sinks.Sink, _ *slog.Logger) sinks.Sink { return s }
