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
	if store.NewCapacity(s, 0, 0) != nil {
		t.Fatal("a gate without limits")
	}
	room := store.NewCapacity(s, 2, 0)
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
	if err := store.NewCapacity(s, 0, 1)(ctx, 1); err == nil || !strings.Contains(err.Error(), "max_redis_memory") {
		t.Fatalf("over max_redis_memory: %v", err)
	}
	if m, err := s.Memory(ctx); err != nil || m.Used <= 0 {
		t.Fatalf("Memory = %+v, %v", m, err)
	}
}
