package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

func TestCapacity(t *testing.T) {
	s := newStore(t, 2)
	ctx := context.Background()
	if store.NewCapacity(s, 0, 0, nil) != nil || store.NewCapacity(s, 0, 0, map[string]int64{"in": 0}).For("in") != nil {
		t.Fatal("a gate without limits")
	}
	room := store.NewCapacity(s, 2, 0, nil).For("")
	take, done, err := room(ctx, 1)
	if err != nil || take != 1 {
		t.Fatal(take, err)
	}
	done() // not parked after all
	now := time.Now()
	if _, err := s.Park(ctx, []*envelope.Message{msg("a", now.Add(time.Hour)), msg("b", now.Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	// 1 let through plus 2 more would pass 2: measured again at once, 2 parked.
	if take, _, err := room(ctx, 2); take != 0 || err == nil || !strings.Contains(err.Error(), "2 messages parked, limits.max_parked_messages is 2") {
		t.Fatalf("at the limit: %d %v", take, err)
	}
	if _, _, err := store.NewCapacity(s, 0, 1, nil).For("")(ctx, 1); err == nil || !strings.Contains(err.Error(), "max_redis_memory") {
		t.Fatalf("over max_redis_memory: %v", err)
	}
	if m, err := s.Memory(ctx); err != nil || m.Used <= 0 {
		t.Fatalf("Memory = %+v, %v", m, err)
	}
}

// An ingest's max_parked holds back that ingest alone; its messages that
// fire make room again.
func TestCapacityPerIngest(t *testing.T) {
	s := newStore(t, 2)
	ctx := context.Background()
	if _, err := s.Census(ctx, false); err != nil {
		t.Fatal(err)
	}
	room := store.NewCapacity(s, 0, 0, map[string]int64{"noisy": 2, "calm": 0})
	var msgs []*envelope.Message
	for _, id := range []string{"n1", "n2"} {
		m := msg(id, time.Now().Add(-time.Second))
		m.Ingest = "noisy"
		msgs = append(msgs, m)
	}
	if _, err := s.Park(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	if _, _, err := room.For("noisy")(ctx, 1); err == nil || !strings.Contains(err.Error(), `ingest "noisy" has 2 messages parked, its max_parked is 2`) {
		t.Fatalf("noisy at its bound: %v", err)
	}
	if take, _, err := room.For("calm")(ctx, 100); take != 100 || err != nil {
		t.Fatalf("calm held back by noisy's bound: %d %v", take, err)
	}
	if take, _, err := room.For("")(ctx, 100); take != 100 || err != nil {
		t.Fatalf("the admin API held back by noisy's bound: %d %v", take, err)
	}
	for sh := 0; sh < s.Shards(); sh++ {
		c, err := s.Claim(ctx, sh, 10, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		var ds []store.Done
		for _, m := range c.Messages {
			ds = append(ds, store.Done{ID: m.Message.ID, Source: m.Message.Ingest})
		}
		if _, err := s.Ack(ctx, c, ds); err != nil {
			t.Fatal(err)
		}
	}
	if take, _, err := room.For("noisy")(ctx, 1); take != 1 || err != nil {
		t.Fatalf("noisy after its messages fired: %d %v", take, err)
	}
}

// A batch larger than the room left is let through in part, up to the
// bound, and what was let through and is not parked yet counts when the
// counts are measured again: a burst does not pass the bound, however the
// parks of a pipeline's workers and the measures interleave.
func TestCapacityTakesWhatFits(t *testing.T) {
	s := newStore(t, 2)
	ctx := context.Background()
	if _, err := s.Census(ctx, false); err != nil {
		t.Fatal(err)
	}
	gate := store.NewCapacity(s, 0, 0, map[string]int64{"in": 100}).For("in")
	take, done, err := gate(ctx, 60)
	if take != 60 || err != nil {
		t.Fatalf("60 of an empty bound of 100: %d %v", take, err)
	}
	// Not parked yet (a worker's park under way): the measure that 60 more
	// asks for finds none in Redis, and still counts them.
	take2, done2, err := gate(ctx, 60)
	if take2 != 40 || !errors.Is(err, store.ErrFull) || !strings.Contains(err.Error(), `ingest "in" has 100 messages parked, its max_parked is 100`) {
		t.Fatalf("60 more with 60 let through: %d %v, want 40 and the bound", take2, err)
	}
	if take, _, err := gate(ctx, 1); take != 0 || !errors.Is(err, store.ErrFull) {
		t.Fatalf("at the bound: %d %v", take, err)
	}
	// Said to be parked (here: not parked after all), they count as Redis
	// does when measured.
	done()
	done2()
	done2() // once only
	if take, _, err := gate(ctx, 256); take != 100 || !strings.Contains(err.Error(), `ingest "in" has 100 messages parked, its max_parked is 100`) {
		t.Fatalf("256 once nothing is parked: %d %v", take, err)
	}
	all := store.NewCapacity(s, 30, 0, nil).For("x")
	if take, _, err := all(ctx, 80); take != 30 || !strings.Contains(err.Error(), "limits.max_parked_messages is 30") {
		t.Fatalf("80 into a store bound of 30: %d %v", take, err)
	}
}
