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

// TestIngestStreamCreatedAgainLosesNothing: an operator deletes the
// ingest's stream under a running daemon, which creates it again. Its
// messages are numbered from 1 again, and those without an ID of their own
// took the IDs derived from their positions that the old stream's messages
// had (DELAYED/1...): the dedupe window took them for re-reads and dropped
// them (the verification probe: 1,238 of 3,000). They are read under a log
// of the new stream's own, and every one is delivered.
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
}

// lazyInt formats as f's value when printed.
type lazyInt func() int

func (l lazyInt) String() string { return fmt.Sprint(l()) }
