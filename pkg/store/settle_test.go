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

// Round settles a lease, commits and claims, on several shards, in one
// pipeline: a shard's settlement is written before its claim, so the
// claim finds what the settlement made due.
func TestRoundSettlesThenClaims(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 4)
	past := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	var msgs []*envelope.Message
	for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
		msgs = append(msgs, msg(id, past))
	}
	park(t, s, store.Parked, msgs...)
	var r store.Round
	for sh := 0; sh < 4; sh++ {
		r.Claim = append(r.Claim, store.Ask{Shard: sh, Max: 10, Lease: time.Minute})
	}
	s.Round(ctx, &r)
	var sts []store.Settlement
	claimed := 0
	for i, l := range r.Leases {
		if r.ClaimErr[i] != nil {
			t.Fatal(r.ClaimErr[i])
		}
		claimed += len(l.Messages)
		if len(l.Messages) > 0 {
			// every first message is retried now: the claim that follows
			// its settlement in the round takes it again
			st := store.Settlement{Lease: l, Retry: []store.RetryAt{{ID: l.Messages[0].ID, At: past, Reason: "again"}}}
			for _, m := range l.Messages[1:] {
				st.Done = append(st.Done, store.Done{ID: m.ID})
			}
			sts = append(sts, st)
		}
	}
	if claimed != 6 {
		t.Fatalf("claimed %d of 6", claimed)
	}
	r2 := store.Round{Settle: sts}
	for sh := 0; sh < 4; sh++ {
		r2.Claim = append(r2.Claim, store.Ask{Shard: sh, Max: 10, Lease: time.Minute})
	}
	s.Round(ctx, &r2)
	again := 0
	for i, l := range r2.Leases {
		if r2.ClaimErr[i] != nil {
			t.Fatal(r2.ClaimErr[i])
		}
		for _, m := range l.Messages {
			again++
			if m.Attempt != 2 {
				t.Errorf("%s claimed again as attempt %d, want 2", m.ID, m.Attempt)
			}
		}
	}
	if again != len(sts) {
		t.Fatalf("claimed again %d, want the %d retried (settled %+v %v)", again, len(sts), r2.Settled, r2.SettleErr)
	}
	for i := range r2.Settle {
		if r2.SettleErr[i] != nil || r2.Settled[i].Retried != 1 {
			t.Errorf("settlement %d: %+v %v", i, r2.Settled[i], r2.SettleErr[i])
		}
	}
}
