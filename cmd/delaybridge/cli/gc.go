package cli

import "runtime/debug"

// daemonGCPercent is the garbage collector target (GOGC) the daemon runs
// with when the environment does not choose one. The daemon's live heap is
// small (buffers and batches in flight, a few MB) and nearly everything it
// allocates dies within one batch, so Go's default of 100 collects far more
// often than memory requires. On the NATS->NATS max-rate benchmark 400 cut
// the daemon's CPU per message by about a quarter and raised throughput by
// ~15%, for ~35 MB more peak RSS (docs/performance.md, "The garbage
// collector").
const daemonGCPercent = 400

// tuneGC sets the collector target of a long-running daemon to
// daemonGCPercent unless GOGC is set, which always wins, and reports
// whether it did. GOMEMLIMIT keeps working as usual: near the limit the
// collector runs as often as it must, whatever the target.
func tuneGC(getenv func(string) string) bool {
	if getenv("GOGC") != "" {
		return false
	}
	debug.SetGCPercent(daemonGCPercent)
	return true
}
