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

// Left is the time until Expired says the time is up: the deadline or the
// send-by bound, whichever comes first.
func TestLeftIsTheTimeToSend(t *testing.T) {
	if left := Left(context.Background()); left < time.Hour*24*365 {
		t.Errorf("no deadline, no bound: %s left, want as good as forever", left)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if left := Left(ctx); left <= 59*time.Minute || left > time.Hour {
		t.Errorf("a deadline an hour away: %s left", left)
	}
	if left := Left(WithSendBy(ctx, time.Now().Add(time.Minute))); left <= 0 || left > time.Minute {
		t.Errorf("a send-by bound a minute away before the deadline: %s left", left)
	}
	if left := Left(WithSendBy(ctx, time.Now().Add(-time.Second))); left > 0 {
		t.Errorf("a send-by bound past: %s left, want none", left)
	}
	if left := Left(pausedCtx{context.Background()}); left > 0 {
		t.Errorf("a deadline past by the clock: %s left, want none", left)
	}
}

// A message not sent is neither the sink's unavailability nor a timeout,
// whatever ended its turn.
func TestNotSentIsItsOwnClass(t *testing.T) {
	err := NotSent(errors.New("not sent: " + context.DeadlineExceeded.Error()))
	wrapped := NotSent(errors.Join(errors.New("not sent"), context.DeadlineExceeded))
	for _, e := range []error{err, wrapped} {
		if !IsNotSent(e) || IsUnavailable(e) || IsSent(e) || IsAgain(e) || IsRejected(e) || ReasonOf(e) != ReasonUnavailable {
			t.Errorf("%v: not sent %v, unavailable %v, reason %q", e, IsNotSent(e), IsUnavailable(e), ReasonOf(e))
		}
	}
}

// A destination down is neither the sink's unavailability, nor a refusal
// of the message, nor maybe sent.
func TestDownIsItsOwnClass(t *testing.T) {
	e := Down(errors.New("the stream does not answer"))
	if !IsDown(e) || IsUnavailable(e) || IsSent(e) || IsAgain(e) || IsRejected(e) || IsNotSent(e) || ReasonOf(e) != ReasonUnavailable {
		t.Errorf("%v: down %v, unavailable %v, rejected %v, reason %q", e, IsDown(e), IsUnavailable(e), IsRejected(e), ReasonOf(e))
	}
}
