package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
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

// A message whose publish was sent and never confirmed (Unconfirmed: a
// timeout) may still be taken by its broker: until it is gone, a cancel, a
// group cancel or a change meets it as in flight, whether it was retried or
// held. A new version of the ID (a replacement) was not sent, and is
// cancelled as any; the mark goes with the message.
func TestUnconfirmedIsInFlight(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 1, MaxDead: 1000})
	past := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	later := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	var msgs []*envelope.Message
	for _, id := range []string{"retried", "held", "plain", "replaced", "grouped", "again"} {
		m := msg(id, past)
		if id == "grouped" {
			m.Group = "g"
		}
		msgs = append(msgs, m)
	}
	park(t, s, store.Parked, msgs...)
	c, err := s.Claim(ctx, 0, 100, time.Minute, nil)
	if err != nil || len(c.Messages) != len(msgs) || slices.ContainsFunc(c.Messages, func(m store.Claimed) bool { return m.Sent }) {
		t.Fatalf("claim: %+v %v, want every message, none sent before", c, err)
	}
	st := store.Settlement{Lease: c,
		Retry: []store.RetryAt{{ID: "retried", At: later, Reason: "timeout"}, {ID: "plain", At: later, Reason: "refused"}, {ID: "replaced", At: later, Reason: "timeout"}, {ID: "grouped", At: later, Reason: "timeout"},
			{ID: "again", At: past, Reason: "timeout"}},
		Hold:        []store.Unavailable{{ID: "held", Band: 0, DueAt: past}},
		Unconfirmed: []string{"retried", "held", "replaced", "grouped", "again"},
	}
	if _, errs := s.Settle(ctx, []store.Settlement{st}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	for _, id := range []string{"retried", "held"} {
		if err := s.Cancel(ctx, id); !errors.Is(err, store.ErrInFlight) {
			t.Errorf("cancel %s: %v, want ErrInFlight", id, err)
		}
		if _, err := s.Reschedule(ctx, id, later.Add(time.Hour), time.Time{}); !errors.Is(err, store.ErrInFlight) {
			t.Errorf("reschedule %s: %v, want ErrInFlight", id, err)
		}
	}
	if n, inflight, err := s.CancelGroup(ctx, "g"); err != nil || n != 0 || inflight != 1 {
		t.Errorf("cancel group: %d cancelled, %d in flight, %v; want 0, 1", n, inflight, err)
	}
	if err := s.Cancel(ctx, "plain"); err != nil {
		t.Errorf("cancel of a message whose publish was refused: %v", err)
	}
	nr := msg("replaced", later)
	nr.Body, nr.Replace = []byte("v2"), true
	park(t, s, store.Replaced, nr)
	if err := s.Cancel(ctx, "replaced"); err != nil {
		t.Errorf("cancel of a new version of an unconfirmed message: %v", err)
	}
	// Published again and confirmed: gone, and so is its mark.
	keys := store.NewKeys("t")
	marks := func() int64 { return r.Client().HLen(ctx, keys.Unconfirmed(0)).Val() }
	if n := marks(); n != 4 {
		t.Errorf("%d marks, want 4 (retried, held, grouped, again)", n)
	}
	c, err = s.Claim(ctx, 0, 100, time.Minute, nil)
	if err != nil || len(c.Messages) != 1 || c.Messages[0].ID != "again" || !c.Messages[0].Sent {
		t.Fatalf("claim again: %+v %v, want again, sent before", c, err)
	}
	if _, errs := s.Settle(ctx, []store.Settlement{{Lease: c, Done: []store.Done{{ID: "again"}}}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if n := marks(); n != 3 {
		t.Errorf("%d marks after the ack, want 3", n)
	}
	// The previous release does not know the marks: migrate down takes them.
	if _, err := s.MigrateDown(ctx); err != nil {
		t.Fatal(err)
	}
	if n := marks(); n != 0 {
		t.Errorf("%d marks after migrate down", n)
	}
}
