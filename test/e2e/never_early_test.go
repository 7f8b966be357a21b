package e2e

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// TestNeverEarly sends messages whose x-deliver-at names an instant with
// random sub-millisecond digits (RFC 3339 with nanoseconds) 0.3-1 s ahead,
// NATS in and out, and checks with zero tolerance that the consumer receives
// each one at or after that instant: the receive time is read
// (time.Now().Round(0), the wall clock without Go's monotonic reading) in
// the callback of a core NATS subscription in this process, on the same
// machine and clock as Redis. The due time is rounded up to the next
// millisecond at ingest, and a message claimed ahead and committed before
// its instant (store.CommitLead) is published once the shard's floor of
// Redis's clock (scheduler.redisFloor, from its round trips) has reached
// it, so nothing is early by even a fraction of one (without the rounding,
// a few in thousands are up to 0.3 ms early). It must pass 20 runs in a
// row:
//
//	go test -count=20 -run TestNeverEarly ./test/e2e/
func TestNeverEarly(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	const n = 500
	e := newNATSEnv(t, "", "")
	nc, err := nats.Connect(e.nats.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var (
		mu   sync.Mutex
		recv = map[string]time.Time{} // first receive of each ID
	)
	sub, err := nc.Subscribe("fired.early", func(m *nats.Msg) {
		at := time.Now().Round(0)
		id := m.Header.Get(envelope.HeaderMessageID)
		mu.Lock()
		if _, ok := recv[id]; !ok {
			recv[id] = at
		}
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	named := map[string]time.Time{}
	for i := range n {
		at := time.Now().Add(300*time.Millisecond + rand.N(700*time.Millisecond))
		if at.Nanosecond()%int(time.Millisecond) == 0 {
			at = at.Add(time.Nanosecond) // always sub-millisecond digits
		}
		text := at.UTC().Format(time.RFC3339Nano)
		instant, err := time.Parse(time.RFC3339Nano, text) // exactly what the header names
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("early-%03d", i)
		named[id] = instant
		e.publish("delayed.early", []byte(id), envelope.HeaderDeliverAt, text, envelope.HeaderMessageID, id,
			envelope.HeaderDestination, "fired.early")
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(recv) == n
	}, "not every message arrived")
	ids := make([]string, 0, n)
	for id := range named {
		ids = append(ids, id)
	}
	e.waitFired(30*time.Second, ids...) // the sink stream's copies, for their headers

	mu.Lock()
	defer mu.Unlock()
	var early int
	margins := latency{}
	closest := time.Duration(1<<63 - 1)
	for id, instant := range named {
		margin := recv[id].Sub(instant)
		margins = append(margins, margin)
		closest = min(closest, margin)
		if margin < 0 {
			early++
			if early <= 10 {
				t.Errorf("%s received at %s, %v before the instant its x-deliver-at names (%s)",
					id, recv[id].UTC().Format(time.RFC3339Nano), -margin, instant.UTC().Format(time.RFC3339Nano))
			}
		}
		due, err := time.Parse(time.RFC3339Nano, e.firedCopies(id)[0].headers.Get(envelope.HeaderDueAt))
		if err != nil || due.Before(instant) {
			t.Errorf("%s: x-delaybridge-due-at %v (%v) is before the named instant %s", id, due, err, instant.UTC().Format(time.RFC3339Nano))
		}
	}
	if early > 0 {
		t.Errorf("%d of %d messages received before the instant they named", early, n)
	}
	t.Logf("%d messages with sub-millisecond x-deliver-at: %d early; receive time minus named instant: min=%v %s", n, early, closest, margins.summary())
}
