package store_test

import (
	"context"
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

	// No rate recorded: a, whose clock runs, changed; b is recorded.
	changed, err := s.ChangedRates(ctx, map[string]float64{"a": 1, "b": 1})
	if err != nil || !slices.Equal(changed, []string{"a"}) {
		t.Fatalf("changed %v, %v; want [a]", changed, err)
	}
	if n := rdb.Exists(ctx, s.Keys().Rate("a")).Val(); n != 0 {
		t.Fatal("a's slot clock was not stopped")
	}
	if v := rdb.HGet(ctx, s.Keys().Sinks(), "rate:b").Val(); v != "1" {
		t.Fatalf("b's rate recorded as %q", v)
	}
	moved, layout1, err := s.Reslot(ctx, "a", 1)
	if err != nil || moved != 15 || layout1 != 0 {
		t.Fatalf("reslot a: moved %d, layout 1 %d, %v; want 15", moved, layout1, err)
	}
	if a, b := waiting("a"), waiting("b"); a != 0 || b != 15 {
		t.Fatalf("after reslot of a, waiting for a slot: a %d, b %d; want 0 and 15", a, b)
	}
	// They are due again: a claim takes them, highest priority first.
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

	// Recorded: the same rates change nothing; a new one for b with its
	// clock running moves b's.
	if changed, err := s.ChangedRates(ctx, map[string]float64{"a": 1, "b": 1}); err != nil || len(changed) != 0 {
		t.Fatalf("unchanged rates: changed %v, %v", changed, err)
	}
	if _, _, err := s.Slots(ctx, "b", 1, 1); err != nil {
		t.Fatal(err)
	}
	if changed, err := s.ChangedRates(ctx, map[string]float64{"a": 1, "b": 5}); err != nil || !slices.Equal(changed, []string{"b"}) {
		t.Fatalf("b to 5/s: changed %v, %v; want [b]", changed, err)
	}
	if moved, _, err := s.Reslot(ctx, "b", 5); err != nil || moved != 15 || waiting("b") != 0 {
		t.Fatalf("reslot b: moved %d, %v", moved, err)
	}
	if v := rdb.HGet(ctx, s.Keys().Sinks(), "rate:b").Val(); v != "5" {
		t.Fatalf("b's rate recorded as %q after reslot", v)
	}
	// A max_rate taken away with no clock running: the record goes.
	if changed, err := s.ChangedRates(ctx, map[string]float64{"a": 0}); err != nil || len(changed) != 0 {
		t.Fatalf("a's max_rate removed: changed %v, %v", changed, err)
	}
	if n := rdb.HExists(ctx, s.Keys().Sinks(), "rate:a").Val(); n {
		t.Fatal("a's rate still recorded")
	}
}
