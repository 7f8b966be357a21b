package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// A changed max_rate reaches the messages that already wait for a slot:
// ChangedRates finds the sinks whose rate differs from the one recorded
// (or was never recorded) while slots are given out, and Reslot moves
// their waiting messages back to their due times, every priority, across
// several calls, leaving the other sinks' slots alone.
func TestChangedRateMovesTheWaitingBackToTheirDueTimes(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		t.Run(map[bool]string{false: "single", true: "cluster"}[cluster], func(t *testing.T) {
			var rdb redis.UniversalClient
			if cluster {
				c := testenv.RedisCluster(t, 3).Client()
				t.Cleanup(func() { _ = c.Close() })
				rdb = c
			} else {
				rdb = testenv.Redis(t).Client()
			}
			testChangedRate(t, rdb)
		})
	}
}

func testChangedRate(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	s := store.New(rdb, store.Options{Prefix: "rs", Shards: 3})
	defer store.SetReslotBatch(4)()

	due := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	var msgs []*envelope.Message
	for i := range 30 {
		m := msg(fmt.Sprintf("m-%02d", i), due.Add(time.Duration(i)*time.Millisecond))
		m.Sink = []string{"a", "b"}[i%2]
		if i%3 == 0 {
			m.Priority = 3
		}
		msgs = append(msgs, m)
	}
	park(t, s, store.Parked, msgs...)
	// Every message waits for a slot an hour ahead, given at a rate of 1/s
	// for a (its slot clock runs); b's clock has stopped.
	if _, _, err := s.Slots(ctx, "a", 15, 1); err != nil {
		t.Fatal(err)
	}
	slot := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	for sh := 0; sh < s.Shards(); sh++ {
		c, err := s.Claim(ctx, sh, 100, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		var slots []store.Slot
		for _, m := range c.Messages {
			slots = append(slots, store.Slot{ID: m.ID, At: slot})
		}
		if _, err := s.Defer(ctx, c, slots); err != nil {
			t.Fatal(err)
		}
	}
	waiting := func(sink string) (n int) {
		t.Helper()
		for _, m := range msgs {
			in := inspect(t, s, m.ID)
			if m.Sink != sink {
				continue
			}
			switch {
			case in.State != store.StateScheduled:
				t.Fatalf("%s: state %s", m.ID, in.State)
			case in.NextAt.Equal(slot):
				n++
			case !in.NextAt.Equal(m.DueAt):
				t.Fatalf("%s: next at %v, neither its slot %v nor its due time %v", m.ID, in.NextAt, slot, m.DueAt)
			}
		}
		return n
	}
	if a, b := waiting("a"), waiting("b"); a != 15 || b != 15 {
		t.Fatalf("waiting for a slot: a %d, b %d; want 15 each", a, b)
	}

	if store.LayoutOfTests() == store.Layout1 {
		// Layout 1 keeps them in its due sets, which are not walked: the
		// rates are recorded and the clock left running.
		changed, layout1, err := s.ChangedRates(ctx, map[string]float64{"a": 1, "b": 1})
		if err != nil || len(changed) != 0 || !layout1 {
			t.Fatalf("layout 1: changed %v, layout1 %v, %v", changed, layout1, err)
		}
		if n := rdb.Exists(ctx, s.Keys().Rate("a")).Val(); n != 1 {
			t.Fatal("layout 1: a's slot clock was stopped")
		}
		if v := rdb.HGet(ctx, s.Keys().Sinks(), "rate:a").Val(); v != "1" {
			t.Fatalf("layout 1: a's rate recorded as %q", v)
		}
		return
	}

	// No rate recorded: a, whose clock runs, changed (its clock stopped,
	// the sink paused for the walk); b, whose clock stopped, is recorded.
	changed, layout1, err := s.ChangedRates(ctx, map[string]float64{"a": 1, "b": 1})
	if err != nil || layout1 || !slices.Equal(changed, []string{"a"}) {
		t.Fatalf("changed %v, layout1 %v, %v; want [a]", changed, layout1, err)
	}
	if n := rdb.Exists(ctx, s.Keys().Rate("a")).Val(); n != 0 {
		t.Fatal("a's slot clock was not stopped")
	}
	states, err := s.SinkStates(ctx, []string{"a", "b"})
	if err != nil || !states["a"].RateSet || states["a"].MaxRate != 1 || !states["a"].Paused || states["b"].Paused || states["b"].MaxRate != 1 {
		t.Fatalf("after the change, as every instance reads it: a %+v, b %+v, %v", states["a"], states["b"], err)
	}
	// Another instance starting meanwhile leaves the walk to its walker.
	if changed, _, err := s.ChangedRates(ctx, map[string]float64{"a": 1, "b": 1}); err != nil || len(changed) != 0 {
		t.Fatalf("a start during the walk: changed %v, %v; want none", changed, err)
	}
	moved, err := s.Reslot(ctx, "a")
	if err != nil || moved != 15 {
		t.Fatalf("reslot a: moved %d, %v; want 15", moved, err)
	}
	if a, b := waiting("a"), waiting("b"); a != 0 || b != 15 {
		t.Fatalf("after reslot of a, waiting for a slot: a %d, b %d; want 0 and 15", a, b)
	}
	if states, err := s.SinkStates(ctx, []string{"a"}); err != nil || states["a"].Paused {
		t.Fatalf("a not resumed after its walk: %+v, %v", states["a"], err)
	}
	// They are due again: a claim takes them.
	var claimed int
	for sh := 0; sh < s.Shards(); sh++ {
		c, err := s.Claim(ctx, sh, 100, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range c.Messages {
			if m.Message.Sink != "a" || !m.Slot.IsZero() {
				t.Fatalf("claimed %s of sink %s with slot %v", m.ID, m.Message.Sink, m.Slot)
			}
		}
		claimed += len(c.Messages)
	}
	if claimed != 15 {
		t.Fatalf("claimed %d of a's 15", claimed)
	}

	// b paused by an operator, then its rate changed while its clock
	// runs: walked, and left paused.
	if err := s.SetPaused(ctx, "b", true); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Slots(ctx, "b", 1, 1); err != nil {
		t.Fatal(err)
	}
	if changed, _, err := s.ChangedRates(ctx, map[string]float64{"a": 1, "b": 5}); err != nil || !slices.Equal(changed, []string{"b"}) {
		t.Fatalf("b to 5/s: changed %v, %v; want [b]", changed, err)
	}
	if moved, err := s.Reslot(ctx, "b"); err != nil || moved != 15 || waiting("b") != 0 {
		t.Fatalf("reslot b: moved %d, %v", moved, err)
	}
	if states, err := s.SinkStates(ctx, []string{"b"}); err != nil || !states["b"].Paused || states["b"].MaxRate != 5 {
		t.Fatalf("b after its walk: %+v, %v; want still paused, at 5/s", states["b"], err)
	}
	// A walk whose walker went silent is taken over by the next start.
	if err := rdb.HSet(ctx, s.Keys().Sinks(), "reslot:b", "keep:1").Err(); err != nil {
		t.Fatal(err)
	}
	if changed, _, err := s.ChangedRates(ctx, map[string]float64{"a": 1, "b": 5}); err != nil || !slices.Equal(changed, []string{"b"}) {
		t.Fatalf("a walk left unfinished: changed %v, %v; want [b]", changed, err)
	}
	// No max_rate any more, its clock stopped: recorded as none, for the
	// others to follow.
	if changed, _, err := s.ChangedRates(ctx, map[string]float64{"a": 0}); err != nil || len(changed) != 0 {
		t.Fatalf("a's max_rate removed: changed %v, %v", changed, err)
	}
	if states, err := s.SinkStates(ctx, []string{"a"}); err != nil || !states["a"].RateSet || states["a"].MaxRate != 0 {
		t.Fatalf("a's rate after removal: %+v, %v", states["a"], err)
	}
}

// The walk goes on from the last (slot, ID) it saw: entries a claim takes
// out of the set before it between two calls make it pass over nothing.
func TestReslotPassesOverNothingWhileClaimsTakeOut(t *testing.T) {
	if store.LayoutOfTests() == store.Layout1 {
		t.Skip("layout 1 has no slot sets to walk (TestChangedRateMovesTheWaitingBackToTheirDueTimes covers it)")
	}
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s := store.New(rdb, store.Options{Prefix: "rp", Shards: 1})
	defer store.SetReslotBatch(3)()
	due := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	var msgs []*envelope.Message
	for i := range 12 {
		m := msg(fmt.Sprintf("m-%02d", i), due)
		m.Sink = []string{"a", "b"}[i%2]
		msgs = append(msgs, m)
	}
	park(t, s, store.Parked, msgs...)
	c, err := s.Claim(ctx, 0, 100, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	// b's slots come first, and have come (a claim may take them); a's
	// are an hour ahead.
	var slots []store.Slot
	for i, m := range c.Messages {
		at := time.Now().Add(time.Hour).Add(time.Duration(i) * time.Millisecond)
		if m.Message.Sink == "b" {
			at = time.Now().Add(-time.Second).Add(time.Duration(i) * time.Millisecond)
		}
		slots = append(slots, store.Slot{ID: m.ID, At: at})
	}
	if _, err := s.Defer(ctx, c, slots); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Slots(ctx, "a", 1, 1); err != nil {
		t.Fatal(err)
	}
	if changed, _, err := s.ChangedRates(ctx, map[string]float64{"a": 2}); err != nil || len(changed) != 1 {
		t.Fatalf("changed %v, %v", changed, err)
	}
	// Between the walk's calls, claims take b's messages, whose slots
	// came, out of the front of the set.
	store.SetReslotHook(func() {
		if _, err := s.Claim(ctx, 0, 1, time.Minute, nil); err != nil {
			t.Error(err)
		}
	})
	defer store.SetReslotHook(nil)
	moved, err := s.Reslot(ctx, "a")
	if err != nil || moved != 6 {
		t.Fatalf("reslot while claims take b's out: moved %d of a's 6, %v", moved, err)
	}
}

// A walk under way: a start with another rate records it and leaves the
// walk to its walker; an operator's pause meanwhile outlasts the walk; a
// walk whose walker went silent is taken over by one running instance,
// with its sink paused again.
func TestAWalkUnderWay(t *testing.T) {
	if store.LayoutOfTests() == store.Layout1 {
		t.Skip("layout 1 is not walked")
	}
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s := store.New(rdb, store.Options{Prefix: "wu", Shards: 2})
	if _, err := s.SinkStates(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Slots(ctx, "a", 1, 1); err != nil {
		t.Fatal(err)
	}
	if changed, _, err := s.ChangedRates(ctx, map[string]float64{"a": 2}); err != nil || len(changed) != 1 {
		t.Fatalf("changed %v, %v", changed, err)
	}
	state := func() store.SinkState {
		t.Helper()
		st, err := s.SinkStates(ctx, []string{"a"})
		if err != nil {
			t.Fatal(err)
		}
		return st["a"]
	}
	if changed, _, err := s.ChangedRates(ctx, map[string]float64{"a": 3}); err != nil || len(changed) != 0 || state().MaxRate != 3 {
		t.Fatalf("a start during the walk: changed %v, %v, recorded %+v; want none, 3 recorded", changed, err, state())
	}
	if taken, err := s.TakeOverWalks(ctx, []string{"a"}); err != nil || len(taken) != 0 {
		t.Fatalf("a walk whose walker is alive taken over: %v, %v", taken, err)
	}
	// Its walker goes silent; an operator resumed the sink meanwhile.
	if err := rdb.HSet(ctx, s.Keys().Sinks(), "reslot:a", "resume:1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPaused(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	taken, err := s.TakeOverWalks(ctx, []string{"a"})
	if err != nil || !slices.Equal(taken, []string{"a"}) || !state().Paused {
		t.Fatalf("a silent walk: taken %v, %v, state %+v; want [a], paused again", taken, err, state())
	}
	if taken, err := s.TakeOverWalks(ctx, []string{"a"}); err != nil || len(taken) != 0 {
		t.Fatalf("taken twice: %v, %v", taken, err)
	}
	// An operator pauses it during the walk: still paused after.
	if err := s.SetPaused(ctx, "a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reslot(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if !state().Paused {
		t.Fatal("the walk's end resumed a sink an operator paused during it")
	}
	if n := rdb.HExists(ctx, s.Keys().Sinks(), "reslot:a").Val(); n {
		t.Fatal("the walk's mark outlived it")
	}
	// A walker cut off meanwhile that tries again finds the walk ended,
	// and leaves the running slot clock alone.
	if _, _, err := s.Slots(ctx, "a", 1, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reslot(ctx, "a"); !errors.Is(err, store.ErrWalkGone) {
		t.Fatalf("a walk again after its end: %v, want ErrWalkGone", err)
	}
	if rdb.Exists(ctx, s.Keys().Rate("a")).Val() != 1 {
		t.Fatal("a walk again after its end stopped the slot clock")
	}
	if err := s.ReslotAlive(ctx, "a"); !errors.Is(err, store.ErrWalkGone) {
		t.Fatalf("alive after the end: %v, want ErrWalkGone", err)
	}
}

// An operator's pause that lands while a walk ends, or while its walker
// says it is alive, stays: the mark and the pause that depends on it are
// read and written in one step (lua/walkmark.lua), where the walk's end read
// the mark, then deleted it with the pause the change had made, and so
// the pause made in between.
func TestAPauseAsTheWalkEndsStays(t *testing.T) {
	if store.LayoutOfTests() == store.Layout1 {
		t.Skip("layout 1 is not walked")
	}
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s := store.New(rdb, store.Options{Prefix: "pe", Shards: 2})
	if _, err := s.SinkStates(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		// A change of the rate while the slot clock runs pauses the sink
		// for its walk, and would resume it at the end.
		if _, _, err := s.Slots(ctx, "a", 1, 1); err != nil {
			t.Fatal(err)
		}
		if changed, _, err := s.ChangedRates(ctx, map[string]float64{"a": float64(2 + round)}); err != nil || len(changed) != 1 {
			t.Fatalf("changed %v, %v", changed, err)
		}
		pause := func() {
			if err := s.SetPaused(ctx, "a", true); err != nil {
				t.Error(err)
			}
		}
		if round == 0 {
			store.SetWalkEndingHook(pause)
		} else {
			// The walker's word that it is alive, then the pause, then its
			// end: the word must not turn the mark back to "resume".
			store.SetWalkEndingHook(func() {
				pause()
				if err := s.ReslotAlive(ctx, "a"); err != nil {
					t.Error(err)
				}
			})
		}
		_, err := s.Reslot(ctx, "a")
		store.SetWalkEndingHook(nil)
		if err != nil {
			t.Fatal(err)
		}
		st, err := s.SinkStates(ctx, []string{"a"})
		if err != nil {
			t.Fatal(err)
		}
		if !st["a"].Paused {
			t.Fatalf("round %d: an operator paused the sink as its walk ended; the end resumed it", round)
		}
		if rdb.HExists(ctx, s.Keys().Sinks(), "reslot:a").Val() {
			t.Fatalf("round %d: the walk's mark outlived it", round)
		}
		if err := s.SetPaused(ctx, "a", false); err != nil {
			t.Fatal(err)
		}
	}
}
