//go:build bench

package bench

import (
	"math"
	"testing"
)

// TestHistogramQuantile checks the interpolation against values worked out
// by hand the way Prometheus's histogram_quantile does them.
func TestHistogramQuantile(t *testing.T) {
	bounds := []float64{0.00025, 0.0005, 0.001, 0.0025}
	counts := []float64{10, 40, 80, 100}
	for _, c := range []struct {
		q, total, want float64
	}{
		{0.5, 100, 0.000625},  // rank 50 in (0.5 ms, 1 ms], 10 of its 40
		{0.99, 100, 0.002425}, // rank 99 in (1 ms, 2.5 ms], 19 of its 20
		{0.05, 100, 0.000125}, // rank 5 in the first bucket, from 0
		{0.99, 120, 0.0025},   // beyond the last finite bound: that bound
	} {
		if got := histogramQuantile(c.q, bounds, counts, c.total); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("q %v of %v: %v, want %v", c.q, c.total, got, c.want)
		}
	}
}
