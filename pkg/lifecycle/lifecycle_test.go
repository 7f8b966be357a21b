package lifecycle

import (
	"context"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	var last time.Duration
	for i := range 10 {
		d := b.Next()
		if d < 75*time.Millisecond || d > 1250*time.Millisecond {
			t.Fatalf("wait %d: %v out of bounds", i, d)
		}
		last = d
	}
	if last < 750*time.Millisecond {
		t.Errorf("after 10 tries the wait is %v, want about Max", last)
	}
	if !b.Failing() {
		t.Error("Failing after Next: false")
	}
	b.Reset()
	if b.Failing() {
		t.Error("Failing after Reset: true")
	}
	if d := b.Next(); d > 125*time.Millisecond {
		t.Errorf("after Reset: %v", d)
	}
	done := make(chan struct{})
	close(done)
	if b.Wait(context.Background(), done) {
		t.Error("Wait with done closed: true")
	}
}

func TestDrainContext(t *testing.T) {
	ctx, stop := context.WithCancel(context.Background())
	work, cancel := DrainContext(ctx, 50*time.Millisecond)
	defer cancel()
	stop()
	if work.Err() != nil {
		t.Fatal("the work context ended with ctx; it should outlive it by the budget")
	}
	select {
	case <-work.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the work context did not end after its budget")
	}

	// Cancelled by its owner before ctx ends: ends at once.
	work2, cancel2 := DrainContext(context.Background(), time.Hour)
	cancel2()
	if work2.Err() == nil {
		t.Error("cancel did not end the work context")
	}
}
