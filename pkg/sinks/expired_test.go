package sinks

import (
	"context"
	"errors"
	"testing"
	"time"
)

// pausedCtx is a context whose deadline has passed while its timer has not
// fired yet, as a process resumed from a pause sees it.
type pausedCtx struct{ context.Context }

func (pausedCtx) Deadline() (time.Time, bool) { return time.Now().Add(-time.Second), true }
func (pausedCtx) Err() error                  { return nil }

func TestExpiredReadsTheClock(t *testing.T) {
	if err := Expired(pausedCtx{context.Background()}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a deadline past by the clock, its timer not fired: %v, want DeadlineExceeded", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if err := Expired(ctx); err != nil {
		t.Fatalf("a deadline an hour away: %v", err)
	}
	cancel()
	if err := Expired(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}
