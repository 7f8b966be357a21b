package store

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// MigrateDown writes what the releases before the seen buckets read of the
// dedupe window, so that a rollback to one of them tells re-reads as this
// build does: each mark of a live bucket (Keys.Seen) as the key of one
// message (Keys.Done) that those releases read, expiring with its bucket.
// Everything else this build writes they read, or ignore harmlessly (the
// layout field, the tally, the index of the dead by source: a later build
// counts and cleans them again). A key already there is left alone, so it
// is safe to run twice and while daemons run; marks a daemon of this build
// writes after it are not copied, so run it after the last one stopped
// (docs/operations.md, "Upgrades and rollbacks with messages parked"). It
// returns how many keys it wrote.
func (s *Store) MigrateDown(ctx context.Context) (int, error) {
	if s.dedupe <= 0 {
		return 0, nil // no dedupe window: no marks
	}
	cur := s.seen(time.Now()).cur
	type bucket struct {
		shard int
		marks *redis.MapStringStringCmd
		ttl   *redis.DurationCmd
	}
	var buckets []bucket
	pipe := s.rdb.Pipeline()
	for shard := 0; shard < s.shards; shard++ {
		// A bucket lives three windows from its start: cur-2..cur hold
		// marks; cur-3 and cur+1 cover a clock a window apart.
		for b := cur - 3; b <= cur+1; b++ {
			key := s.keys.Seen(shard, b)
			buckets = append(buckets, bucket{shard: shard, marks: pipe.HGetAll(ctx, key), ttl: pipe.PTTL(ctx, key)})
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return 0, fmt.Errorf("store: migrate down: read the dedupe window: %w", err)
	}
	written := 0
	write := s.rdb.Pipeline()
	var sets []*redis.BoolCmd
	for _, b := range buckets {
		ttl := b.ttl.Val()
		if ttl <= 0 {
			continue // gone, or (never written by this build) without expiry
		}
		for field, mark := range b.marks.Val() {
			sets = append(sets, write.SetNX(ctx, s.keys.doneOf(b.shard, field), mark, ttl))
		}
	}
	if len(sets) == 0 {
		return 0, nil
	}
	if _, err := write.Exec(ctx); err != nil && err != redis.Nil {
		return 0, fmt.Errorf("store: migrate down: write the done keys: %w", err)
	}
	for _, c := range sets {
		if c.Val() {
			written++
		}
	}
	return written, nil
}
