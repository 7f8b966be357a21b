package scheduler

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/pkg/lifecycle"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// gate decides which sinks may be fired to: a sink that is down (its
// connection not ready, or a publish just failed for a reason that was not
// the message's) or paused (for every instance, in Redis) is blocked, and
// the claims hold its due messages in its hold band instead of taking them.
// When a sink can take messages again, the gate releases its held messages
// back to their due times, earliest first, and wakes the shards.
//
// The gate refreshes from Redis (pause flags, hold bands) and from the sinks
// (Ready) every refresh interval; a publish that fails as unavailable blocks
// its sink at once, for a back-off that grows while the sink keeps failing.
type gate struct {
	store   Store
	sinks   map[string]sinks.Sink
	batch   int
	log     *slog.Logger
	metrics *metrics.Metrics
	wake    func() // wakes every shard, after a release

	mu    sync.Mutex
	state map[string]*sinkGate
	// orphansAt is when the next refresh looks for held messages of sinks
	// this instance does not configure (orphanEvery).
	orphansAt time.Time
}

// maxRate is the max_rate the sink's slots are given at: the one recorded
// in Redis by the last instance to start (store.ChangedRates), as of the
// last refresh, else configured.
func (g *gate) maxRate(sink string, configured float64) float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if sg := g.state[sink]; sg != nil && sg.rateSet {
		return sg.maxRate
	}
	return configured
}

// orphanEvery is how often a gate releases the held messages of the sinks
// in Redis that this instance does not configure: a sink removed from the
// configuration, or, while a configuration change rolls out, one that
// other instances have. Their messages then fail here as not configured,
// an attempt each; once a minute bounds what that costs a sink that is
// only down, and the look itself (a read per shard and priority).
const orphanEvery = time.Minute

// sinkGate is the gate's view of one sink.
type sinkGate struct {
	band      int
	paused    bool
	maxRate   float64 // as recorded in Redis (rateSet), which wins over the configured one
	rateSet   bool
	notReady  error     // the sink's Ready, when it says it is not
	downUntil time.Time // after an unavailable publish: blocked until then (local clock)
	backoff   lifecycle.Backoff
	blocked   bool // as of the last refresh
}

func newGate(st Store, sk map[string]sinks.Sink, batch int, log *slog.Logger, m *metrics.Metrics, wake func()) *gate {
	g := &gate{store: st, sinks: sk, batch: batch, log: log, metrics: m, wake: wake, state: map[string]*sinkGate{}}
	for name := range sk {
		g.state[name] = &sinkGate{backoff: downBackoff}
	}
	return g
}

// downBackoff is how long a sink down is blocked after each unavailable
// publish in a row, and what a message whose destination is down
// (sinks.Down) waits, by how long it has waited already.
var downBackoff = lifecycle.Backoff{Min: 500 * time.Millisecond, Max: 30 * time.Second}

// names returns the configured sink names, sorted.
func (g *gate) names() []string {
	names := make([]string, 0, len(g.sinks))
	for n := range g.sinks {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// refresh reads the pause flags and hold bands from Redis and the sinks'
// readiness, then releases the held messages of every sink that can take
// them.
func (g *gate) refresh(ctx context.Context, now time.Time) error {
	states, err := g.store.SinkStates(ctx, g.names())
	if err != nil {
		return err
	}
	var release []string
	g.mu.Lock()
	for name, sg := range g.state {
		rs := states[name]
		sg.band, sg.paused = rs.Band, rs.Paused
		if sg.rateSet && rs.RateSet && rs.MaxRate != sg.maxRate {
			g.log.Info("the sink's max_rate recorded in redis changed (an instance started with another): slots are given at it",
				"sink", name, "max_rate", rs.MaxRate, "was", sg.maxRate)
		}
		sg.maxRate, sg.rateSet = rs.MaxRate, rs.RateSet
		sg.notReady = nil
		if r, ok := g.sinks[name].(sinks.Ready); ok {
			sg.notReady = r.Ready()
		}
		was := sg.blocked
		sg.blocked = sg.paused || sg.notReady != nil || now.Before(sg.downUntil)
		if !sg.blocked {
			release = append(release, name)
		}
		if was != sg.blocked {
			g.log.Info("sink "+map[bool]string{true: "blocked: its due messages are held", false: "open again: releasing its held messages"}[sg.blocked],
				"sink", name, "paused", sg.paused, "not_ready", errString(sg.notReady), "down_until", sg.downUntil)
		}
		paused := 0.0
		if sg.paused {
			paused = 1
		}
		g.metrics.SinkPaused.WithLabelValues(name).Set(paused)
	}
	orphans := !now.Before(g.orphansAt)
	if orphans {
		for name, rs := range states {
			if _, ok := g.state[name]; !ok && !rs.Paused {
				release = append(release, name) // another instance's, or an earlier configuration's
			}
		}
	}
	g.mu.Unlock()
	released := 0
	for _, name := range release {
		n, err := g.releaseAll(ctx, name, states[name].Band)
		released += n
		if err != nil {
			if released > 0 {
				g.wake() // what came back before the error
			}
			return err
		}
	}
	if released > 0 {
		g.wake()
	}
	if orphans { // looked at again after orphanEvery, once released: a refresh cut short looks again at the next
		g.mu.Lock()
		g.orphansAt = now.Add(orphanEvery)
		g.mu.Unlock()
	}
	return nil
}

// releaseAll moves every held message of a sink (of hold band band) back
// to its due time. A sink this instance does not configure, and that is
// not paused, is released too: its messages were held while another
// instance, or an earlier configuration, had it, and would otherwise wait
// for a release no instance makes. Claimed here, they fail as "not
// configured" and die after their attempts, where an operator sees them
// and can retry them to another sink.
func (g *gate) releaseAll(ctx context.Context, name string, band int) (int, error) {
	total, err := g.store.ReleaseAll(ctx, band, g.batch)
	if err != nil {
		return total, err
	}
	switch _, configured := g.sinks[name]; {
	case total > 0 && configured:
		g.log.Info("released held messages", "sink", name, "messages", total)
	case total > 0:
		g.log.Warn("released held messages of a sink this instance does not configure: they fail as not configured and go dead after their attempts, unless an instance that configures it publishes them first",
			"sink", name, "messages", total)
	}
	return total, nil
}

func (g *gate) band(name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state[name].band
}

// blocked returns the sinks whose due messages the claims hold, with their
// hold bands, as of now.
func (g *gate) blocked(now time.Time) map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out map[string]int
	for name, sg := range g.state {
		if sg.paused || sg.notReady != nil || now.Before(sg.downUntil) {
			if out == nil {
				out = map[string]int{}
			}
			out[name] = sg.band
		}
	}
	return out
}

// unavailable blocks a sink whose publish just failed for a reason that
// was not the message's, for a back-off that grows while it keeps failing.
func (g *gate) unavailable(name string, now time.Time, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	sg := g.state[name]
	if sg == nil {
		return
	}
	if now.Before(sg.downUntil) {
		return // blocked already
	}
	wait := sg.backoff.Next()
	sg.downUntil = now.Add(wait)
	g.log.Warn("sink unavailable: its due messages wait for it, their attempts not counted", "sink", name, "retry_in", wait, "err", err)
}

// delivered records a publish the sink confirmed: its back-off starts over.
func (g *gate) delivered(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if sg := g.state[name]; sg != nil && sg.backoff.Failing() {
		sg.backoff.Reset()
	}
}

// SinkStatus is what the scheduler knows of a sink.
type SinkStatus struct {
	Name    string
	Ready   error // nil when connected
	Paused  bool
	Blocked bool // held: paused, not ready, or failing
}

// Sinks returns the status of every configured sink, sorted by name.
func (s *Scheduler) Sinks() []SinkStatus {
	g := s.gate
	now := s.p.Clock.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]SinkStatus, 0, len(g.state))
	for name, sg := range g.state {
		out = append(out, SinkStatus{Name: name, Ready: sg.notReady, Paused: sg.paused,
			Blocked: sg.paused || sg.notReady != nil || now.Before(sg.downUntil)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Refresh makes the gate read the sinks' state now (after a pause or a
// resume), instead of at its next tick.
func (s *Scheduler) Refresh(ctx context.Context) error {
	if err := s.gate.refresh(ctx, s.p.Clock.Now()); err != nil {
		return fmt.Errorf("scheduler: sink state: %w", err)
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
