package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// TestIngestStreamCreatedAgainLosesNothing: the ingest's stream deleted and
// created again, under a running daemon (which creates it again) and while
// none runs. Its messages are numbered from 1 again; those without an ID of
// their own would take the IDs derived from their positions that the old
// stream's messages had (DELAYED/1...), which the dedupe window takes for
// re-reads. They are read under a log name of the new stream's own, and
// every one is delivered, once.
func TestIngestStreamCreatedAgainLosesNothing(t *testing.T) {
	e := newNATSEnv(t, "", "")
	const n = 20
	bodies := func(prefix string) map[string]bool {
		want := map[string]bool{}
		for i := range n {
			want[fmt.Sprintf("%s-%d", prefix, i)] = true
		}
		return want
	}
	delivered := func(want map[string]bool) int {
		e.mu.Lock()
		defer e.mu.Unlock()
		got := 0
		for _, copies := range e.fired {
			for _, f := range copies {
				if want[string(f.body)] {
					got++
					break
				}
			}
		}
		return got
	}
	old := bodies("old")
	for b := range old {
		e.publish("delayed.a", []byte(b), envelope.HeaderDelay, "0")
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return delivered(old) == n }, "the first %d delivered", n)

	ctx := context.Background()
	if err := e.js.DeleteStream(ctx, "DELAYED"); err != nil {
		t.Fatal(err)
	}
	// The daemon creates it again (or this test does, whichever is first).
	testenv.Eventually(t, 20*time.Second, func() bool {
		_, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "DELAYED", Subjects: []string{"delayed.>"}})
		return err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse)
	}, "the stream created again")
	renewed := bodies("new")
	for b := range renewed {
		e.publish("delayed.a", []byte(b), envelope.HeaderDelay, "0")
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return delivered(renewed) == n },
		"messages without an ID published to the stream created again: %s of %d delivered", lazyInt(func() int { return delivered(renewed) }), n)

	// Deleted and created again while no instance runs: told apart the
	// same way, by its creation time against the first one recorded.
	e.d.stop()
	if err := e.js.DeleteStream(ctx, "DELAYED"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "DELAYED", Subjects: []string{"delayed.>"}}); err != nil {
		t.Fatal(err)
	}
	third := bodies("third")
	for b := range third {
		e.publish("delayed.a", []byte(b), envelope.HeaderDelay, "0")
	}
	e.d.start()
	testenv.Eventually(t, 30*time.Second, func() bool { return delivered(third) == n },
		"messages without an ID published to the stream created again while no instance ran: %s of %d delivered", lazyInt(func() int { return delivered(third) }), n)
	// Each once: nothing read twice under two names.
	e.caughtUp()
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, copies := range e.fired {
		if len(copies) != 1 {
			t.Errorf("%s delivered %d times", id, len(copies))
		}
	}
}

// lazyInt formats as f's value when printed.
type lazyInt func() int

func (l lazyInt) String() string { return fmt.Sprint(l()) }
