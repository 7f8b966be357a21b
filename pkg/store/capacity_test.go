package store_test

import (
	"context"
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
	if err := room(ctx, 1); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, err := s.Park(ctx, []*envelope.Message{msg("a", now.Add(time.Hour)), msg("b", now.Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	// 1 let through plus 2 more would pass 2: measured again at once, 2 parked.
	if err := room(ctx, 2); err == nil || !strings.Contains(err.Error(), "max_parked_messages") {
		t.Fatalf("at the limit: %v", err)
	}
	if err := store.NewCapacity(s, 0, 1, nil).For("")(ctx, 1); err == nil || !strings.Contains(err.Error(), "max_redis_memory") {
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
	if err := room.For("noisy")(ctx, 1); err == nil || !strings.Contains(err.Error(), `ingest "noisy" has 2 messages parked, its max_parked is 2`) {
		t.Fatalf("noisy at its bound: %v", err)
	}
	if room.For("calm") != nil && room.For("calm")(ctx, 100) != nil {
		t.Fatal("calm held back by noisy's bound")
	}
	if err := room.For("")(ctx, 100); err != nil {
		t.Fatalf("the admin API held back by noisy's bound: %v", err)
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
	if err := room.For("noisy")(ctx, 1); err != nil {
		t.Fatalf("noisy after its messages fired: %v", err)
	}
}
