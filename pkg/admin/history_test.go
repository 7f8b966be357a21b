package admin

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/metrics"
)

// The ring keeps the last samples of the counters and the lateness
// histogram, summed over their labels, oldest first.
func TestHistorySamples(t *testing.T) {
	m := metrics.New()
	h := newHistory(m, time.Second, 3*time.Second) // three samples
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	h.take(t0)
	if v := h.view(); len(v.Samples) != 1 || v.Samples[0].Ingested != 0 || v.Samples[0].Lateness.Count != 0 || v.EverySeconds != 1 {
		t.Fatalf("first sample: %+v", v)
	}
	m.IngestMessages.WithLabelValues("a", "parked").Add(3)
	m.IngestMessages.WithLabelValues("b", "rejected").Add(2)
	m.Published.WithLabelValues("rabbit").Add(4)
	m.FireLateness.WithLabelValues("rabbit").Observe(0.002)
	m.FireLateness.WithLabelValues("kafka").Observe(2)
	for i := 1; i <= 3; i++ {
		h.take(t0.Add(time.Duration(i) * time.Second))
	}
	v := h.view()
	if len(v.Samples) != 3 || v.Samples[0].At != "2026-12-01T10:00:01.000Z" || v.Samples[2].At != "2026-12-01T10:00:03.000Z" {
		t.Fatalf("the ring keeps %d samples from %v", len(v.Samples), v.Samples)
	}
	s := v.Samples[2]
	if s.Ingested != 5 || s.Fired != 4 {
		t.Errorf("counters: %+v", s)
	}
	l := s.Lateness
	if l.Count != 2 || l.Sum != 2.002 || len(l.Bounds) != len(l.Cumulative) || len(l.Bounds) == 0 {
		t.Fatalf("lateness: %+v", l)
	}
	for i, b := range l.Bounds {
		want := 0.0
		switch {
		case b >= 2:
			want = 2
		case b >= 0.002:
			want = 1
		}
		if l.Cumulative[i] != want {
			t.Errorf("at most %vs: %v, want %v", b, l.Cumulative[i], want)
		}
	}
}

// A started server samples on its own, GET /v1/history serves the ring,
// and Shutdown stops the sampling.
func TestHistoryServed(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	e.server.history = newHistory(e.server.p.Metrics, 10*time.Millisecond, time.Second)
	e.server.history.start()
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.server.history.view().Samples) >= 3 }, "no samples taken")
	e.server.history.halt()
	n := len(e.server.history.view().Samples)

	r := e.do("GET", "/v1/history", "")
	e.expect(r, http.StatusOK)
	var v HistoryView
	if err := json.Unmarshal(r.body, &v); err != nil || len(v.Samples) != n || v.EverySeconds != 0.01 {
		t.Fatalf("GET /v1/history: %v %s", err, r.body)
	}
	for i := 1; i < len(v.Samples); i++ {
		if mustTime(t, v.Samples[i].At).Before(mustTime(t, v.Samples[i-1].At)) {
			t.Fatalf("samples not oldest first: %s", r.body)
		}
	}
	e.expect(e.doAuth("GET", "/v1/history", "", ""), http.StatusUnauthorized)
	if len(e.server.history.view().Samples) != n {
		t.Error("sampling went on after it was stopped")
	}
}
