package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// MigrateDown copies each mark of the dedupe window into the key of one
// message that the releases before the seen buckets read (Keys.Done),
// expiring with its bucket, so that after a rollback a re-read of a
// message this build delivered is still told as one; a second run writes
// nothing.
func TestMigrateDown(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 2, DedupeWindow: time.Minute})
	m := msg("m", time.Now().Add(-time.Millisecond))
	m.Origin = envelope.Origin{Log: "orders/3", Pos: 5}
	park(t, s, store.Parked, m)
	c, err := s.Claim(ctx, s.ShardOf("m"), 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 1 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	if n, err := s.Ack(ctx, c, []store.Done{{ID: "m", Origin: m.Origin}}); err != nil || n != 1 {
		t.Fatalf("ack: %d %v", n, err)
	}
	if n, err := s.MigrateDown(ctx); err != nil || n != 1 {
		t.Fatalf("migrate down: %d %v, want 1 key written", n, err)
	}
	done := s.Keys().Done(s.ShardOf("m"), "m", "orders/3")
	if v, err := r.Client().Get(ctx, done).Result(); err != nil || v != "5" {
		t.Fatalf("%s: %q %v, want the position 5", done, v, err)
	}
	if ttl := r.Client().PTTL(ctx, done).Val(); ttl <= 0 || ttl > 3*time.Minute {
		t.Fatalf("%s expires in %v, want with its bucket (at most three windows)", done, ttl)
	}
	if n, err := s.MigrateDown(ctx); err != nil || n != 0 {
		t.Fatalf("migrate down again: %d %v, want nothing written", n, err)
	}
	// Without the buckets, as a release before them reads the store: the
	// re-read is still a duplicate.
	seen, err := r.Client().Keys(ctx, "t:*:seen:*").Result()
	if err != nil || len(seen) == 0 {
		t.Fatalf("seen buckets: %v %v", seen, err)
	}
	r.Client().Del(ctx, seen...)
	park(t, s, store.Duplicate, m)
}
