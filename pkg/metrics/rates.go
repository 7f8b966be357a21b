package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// RateMeter keeps, per sink, the messages this instance published over the
// last rateWindow (10 s), from the delaybridge_sink_published_total counter
// sampled every second: the rate GET /v1/sinks shows. It reads process
// memory only. Rate is safe for concurrent use with Run.
type RateMeter struct {
	counter *prometheus.CounterVec
	names   []string

	mu      sync.Mutex
	samples []rateSample // oldest first, at most rateWindow/rateEvery + 1
}

type rateSample struct {
	at     time.Time
	counts map[string]float64
}

const (
	rateEvery  = time.Second
	rateWindow = 10 * time.Second
)

// NewRateMeter returns the meter of counter (Metrics.Published) for the
// sinks names; Run samples it.
func NewRateMeter(counter *prometheus.CounterVec, names []string) *RateMeter {
	return &RateMeter{counter: counter, names: names}
}

// Run samples every second until ctx ends.
func (r *RateMeter) Run(ctx context.Context) {
	t := time.NewTicker(rateEvery)
	defer t.Stop()
	r.sample(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.sample(now)
		}
	}
}

func (r *RateMeter) sample(now time.Time) {
	s := rateSample{at: now, counts: make(map[string]float64, len(r.names))}
	for _, name := range r.names {
		c, err := r.counter.GetMetricWithLabelValues(name)
		if err != nil {
			continue
		}
		var m dto.Metric
		if c.Write(&m) == nil {
			s.counts[name] = m.GetCounter().GetValue()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples = append(r.samples, s)
	if n := int(rateWindow/rateEvery) + 1; len(r.samples) > n {
		r.samples = r.samples[len(r.samples)-n:]
	}
}

// Rate returns the sink's messages/s between the oldest and the newest
// sample (0 before two samples).
func (r *RateMeter) Rate(name string) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.samples) < 2 {
		return 0
	}
	first, last := r.samples[0], r.samples[len(r.samples)-1]
	dt := last.at.Sub(first.at).Seconds()
	if dt <= 0 {
		return 0
	}
	return max(0, last.counts[name]-first.counts[name]) / dt
}
