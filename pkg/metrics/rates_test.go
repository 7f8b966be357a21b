package metrics

import (
	"testing"
	"time"
)

func TestRateMeter(t *testing.T) {
	m := New()
	r := NewRateMeter(m.Published, []string{"a", "b"})
	at := time.Unix(100, 0)
	r.sample(at)
	if got := r.Rate("a"); got != 0 {
		t.Fatalf("rate before two samples: %v", got)
	}
	m.Published.WithLabelValues("a").Add(20)
	r.sample(at.Add(2 * time.Second))
	if got := r.Rate("a"); got != 10 {
		t.Fatalf("rate of a: %v, want 10/s", got)
	}
	if got := r.Rate("b"); got != 0 {
		t.Fatalf("rate of b: %v, want 0", got)
	}
}
