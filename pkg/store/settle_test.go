package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// Settle writes every kind of outcome of one lease in one call, and only
// for messages still held under that lease.
func TestSettleEveryOutcome(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	past := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	ids := []string{"done", "retry", "dead", "hold", "defer", "postpone", "other"}
	var msgs []*envelope.Message
	for _, id := range ids {
		msgs = append(msgs, msg(id, past))
	}
	park(t, s, store.Parked, msgs...)
	c, err := s.Claim(ctx, 0, 100, time.Minute, nil)
	if err != nil || len(c.Messages) != len(ids) {
		t.Fatalf("claim: %+v %v", c, err)
	}
	later := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	st := store.Settlement{Lease: c,
		Done:     []store.Done{{ID: "done"}},
		Retry:    []store.RetryAt{{ID: "retry", At: later, Reason: "boom"}},
		Dead:     []store.Failure{{ID: "dead", Reason: "refused"}},
		Hold:     []store.Unavailable{{ID: "hold", Band: 0, DueAt: past}},
		Defer:    []store.Slot{{ID: "defer", At: later}},
		Postpone: []store.RetryAt{{ID: "postpone", At: later}},
	}
	// A stale lease (another claim's) writes nothing.
	stale := *c
	stale.ExpiryMs--
	stSt := st
	stSt.Lease = &stale
	res, errs := s.Settle(ctx, []store.Settlement{stSt, st})
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	if res[0] != (store.Settled{}) {
		t.Fatalf("a stale lease settled %+v", res[0])
	}
	if res[1] != (store.Settled{Acked: 1, Retried: 1, Dead: 1, PutBack: 3}) {
		t.Fatalf("settled %+v", res[1])
	}
	if _, err := s.Inspect(ctx, "done"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("done: %v", err)
	}
	want := map[string]string{"retry": store.StateScheduled, "dead": store.StateDead, "hold": store.StateHeld,
		"defer": store.StateScheduled, "postpone": store.StateScheduled, "other": store.StateInflight}
	for id, state := range want {
		if info := inspect(t, s, id); info.State != state {
			t.Errorf("%s: %s, want %s", id, info.State, state)
		}
	}
	if info := inspect(t, s, "retry"); info.Attempts != 1 || info.Reason != "boom" || !info.NextAt.Equal(later) {
		t.Errorf("retry: %+v", info)
	}
	if info := inspect(t, s, "postpone"); info.Attempts != 0 || !info.NextAt.Equal(later) {
		t.Errorf("postpone counted an attempt: %+v", info)
	}
}
