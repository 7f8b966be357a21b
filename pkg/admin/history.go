package admin

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/metrics"
)

// The daemon's recent history, for the dashboard: a ring of samples of
// what its charts show (the ingest and fire counters, the fire-lateness
// histogram), taken from its own metrics every HistoryEvery for the last
// HistoryWindow, so that the page shows the last minutes when it opens
// (GET /v1/history) rather than only what it polled itself. The page
// computes rates and quantiles from consecutive samples, as it does from
// its own scrapes of /metrics.

// History's sampling: every HistoryEvery, the last HistoryWindow.
const (
	HistoryEvery  = 2 * time.Second
	HistoryWindow = 5 * time.Minute
)

// HistoryView is GET /v1/history: the samples, oldest first.
type HistoryView struct {
	// Now is the daemon's time of the answer, so that a client on another
	// clock places the samples on its own.
	Now          string   `json:"now" doc:"The daemon's time of this answer (RFC 3339, UTC, milliseconds)."`
	EverySeconds float64  `json:"every_seconds" doc:"The time between two samples."`
	Samples      []Sample `json:"samples"`
}

// Sample is the daemon's counters at one time, summed over their labels.
type Sample struct {
	At       string  `json:"at" doc:"When it was taken (RFC 3339, UTC, milliseconds)."`
	Ingested float64 `json:"ingested" doc:"delaybridge_ingest_messages_total: messages read from the ingests."`
	Fired    float64 `json:"fired" doc:"delaybridge_sink_published_total: messages the sinks confirmed."`
	// Lateness is delaybridge_fire_lateness_seconds.
	Lateness Histogram `json:"lateness"`
}

// Histogram is a Prometheus histogram: Cumulative[i] observations were at
// most Bounds[i] seconds; Count is every observation (the +Inf bucket).
type Histogram struct {
	Bounds     []float64 `json:"bounds"`
	Cumulative []float64 `json:"cumulative"`
	Count      float64   `json:"count"`
	Sum        float64   `json:"sum"`
}

// history is the ring, and the goroutine that fills it between Start and
// Shutdown.
type history struct {
	m     *metrics.Metrics // nil: nothing to sample
	every time.Duration

	mu   sync.Mutex
	ring []Sample // at most cap, oldest first
	max  int

	stop chan struct{}
	done chan struct{}
}

func newHistory(m *metrics.Metrics, every, window time.Duration) *history {
	return &history{m: m, every: every, max: int(window / every)}
}

// start takes a sample now and then every h.every, until stop.
func (h *history) start() {
	if h.m == nil || h.stop != nil {
		return
	}
	h.stop, h.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(h.done)
		t := time.NewTicker(h.every)
		defer t.Stop()
		for {
			h.take(time.Now())
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
}

// halt stops sampling (a no-op when not started).
func (h *history) halt() {
	if h.stop == nil {
		return
	}
	close(h.stop)
	<-h.done
}

// take adds a sample of the metrics at now.
func (h *history) take(now time.Time) {
	s := Sample{At: envelope.FormatTime(now), Ingested: counterSum(h.m.IngestMessages), Fired: counterSum(h.m.Published),
		Lateness: histogramSum(h.m.FireLateness)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ring) == h.max {
		h.ring = slices.Delete(h.ring, 0, 1)
	}
	h.ring = append(h.ring, s)
}

// view returns the samples, oldest first.
func (h *history) view() HistoryView {
	h.mu.Lock()
	defer h.mu.Unlock()
	return HistoryView{Now: envelope.FormatTime(time.Now()), EverySeconds: h.every.Seconds(), Samples: slices.Clone(h.ring)}
}

// collect returns what a collector has now.
func collect(c prometheus.Collector) []*dto.Metric {
	ch := make(chan prometheus.Metric, 16)
	go func() { c.Collect(ch); close(ch) }()
	var out []*dto.Metric
	for m := range ch {
		var pb dto.Metric
		if m.Write(&pb) == nil {
			out = append(out, &pb)
		}
	}
	return out
}

// counterSum sums a counter over its labels.
func counterSum(c prometheus.Collector) float64 {
	n := 0.0
	for _, m := range collect(c) {
		n += m.GetCounter().GetValue()
	}
	return n
}

// histogramSum sums a histogram over its labels (every series has the same
// buckets).
func histogramSum(c prometheus.Collector) Histogram {
	h := Histogram{Bounds: []float64{}, Cumulative: []float64{}}
	for _, m := range collect(c) {
		hist := m.GetHistogram()
		for i, b := range hist.GetBucket() {
			if math.IsInf(b.GetUpperBound(), 1) {
				continue
			}
			if i == len(h.Bounds) {
				h.Bounds = append(h.Bounds, b.GetUpperBound())
				h.Cumulative = append(h.Cumulative, 0)
			}
			h.Cumulative[i] += float64(b.GetCumulativeCount())
		}
		h.Count += float64(hist.GetSampleCount())
		h.Sum += hist.GetSampleSum()
	}
	return h
}
