package store

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// migrateUpScript and migrateDownScript convert a shard between layouts 1
// and 2. (lua/migrateup.lua and lua/migratedown.lua have their KEYS, ARGV
// and reply.)
var (
	migrateUpScript   = loadScript("migrateup")
	migrateDownScript = loadScript("migratedown")
)

// MigrateUp converts the store to Layout2, shard by shard, each in one
// script call, and then records the layout; it returns how many messages
// moved out of the due sets. A shard converted already is left alone, so
// it is safe to run twice, and after a run that stopped half-way. Daemons of
// this build may run meanwhile: a script of theirs that meets a converted
// shard runs again in layout 2. A release before this one reads layout 1
// only: run it once none of them runs any more (docs/operations.md,
// "Upgrades and rollbacks with messages parked").
func (s *Store) MigrateUp(ctx context.Context) (int, error) {
	if err := s.CheckShards(ctx); err != nil {
		return 0, fmt.Errorf("store: migrate up: %w", err)
	}
	// The record's form for layout 2 first: the previous release refuses a
	// store half way through (shardsRecord), as it does one converted.
	if err := s.rdb.HSet(ctx, s.keys.Config(), "shards", shardsRecord(s.shards, Layout2)).Err(); err != nil {
		return 0, fmt.Errorf("store: migrate up: record the shard count in %s: %w", s.keys.Config(), err)
	}
	moved := 0
	for sh := range s.shards {
		n, err := s.run(ctx, "migrate_up", migrateUpScript, sh).Int()
		if err != nil {
			return moved, fmt.Errorf("store: migrate up, shard %d: %w (the shards before it are converted; run it again)", sh, err)
		}
		moved += n
		s.layouts[sh].Store(Layout2)
	}
	if err := s.rdb.HSet(ctx, s.keys.Config(), "layout", Layout2, "shards", shardsRecord(s.shards, Layout2)).Err(); err != nil {
		return moved, fmt.Errorf("store: migrate up: record the layout in %s: %w (run it again)", s.keys.Config(), err)
	}
	return moved, nil
}

// Migrated is what MigrateDown did.
type Migrated struct {
	Moved int // messages moved back into the due sets of layout 1
	Marks int // dedupe marks written as the keys the previous release reads
}

// MigrateDown takes the store back to what the previous release reads: it
// converts every shard in Layout2 back to Layout1 (as MigrateUp, one
// script call each; the shard's marker says "1", so that a daemon of this
// build that still runs follows it even on an empty shard), records layout
// 1, and writes the dedupe window's marks as that release reads them
// (downMarks). Run it after the last daemon of this build stopped, before
// the previous release starts (docs/operations.md, "Upgrades and
// rollbacks with messages parked"); it is safe to run twice.
func (s *Store) MigrateDown(ctx context.Context) (Migrated, error) {
	var out Migrated
	if err := s.CheckShards(ctx); err != nil {
		return out, fmt.Errorf("store: migrate down: %w", err)
	}
	// Until the last shard is converted the previous release must refuse
	// the store (shardsRecord); the count alone comes with layout 1.
	if err := s.rdb.HSet(ctx, s.keys.Config(), "shards", shardsRecord(s.shards, Layout2)).Err(); err != nil {
		return out, fmt.Errorf("store: migrate down: record the shard count in %s: %w", s.keys.Config(), err)
	}
	for sh := range s.shards {
		n, err := s.run(ctx, "migrate_down", migrateDownScript, sh).Int()
		if err != nil {
			return out, fmt.Errorf("store: migrate down, shard %d: %w (run it again)", sh, err)
		}
		out.Moved += n
		s.layouts[sh].Store(Layout1)
	}
	if err := s.rdb.HSet(ctx, s.keys.Config(), "layout", Layout1, "shards", shardsRecord(s.shards, Layout1)).Err(); err != nil {
		return out, fmt.Errorf("store: migrate down: record the layout in %s: %w (run it again)", s.keys.Config(), err)
	}
	n, err := s.downMarks(ctx)
	out.Marks = n
	return out, err
}

// downMarks writes what the releases before the seen buckets read of the
// dedupe window, so that a rollback to one of them tells re-reads as this
// build does: each mark of a live bucket (Keys.Seen) as the key of one
// message (Keys.Done) that those releases read, expiring with its bucket.
// Everything else this build writes in layout 1 they read, or ignore
// harmlessly (the layout field, the tally, the index of the dead by source:
// a later build counts and cleans them again). A key already there is left
// alone, so it is safe to run twice and while daemons run; marks a daemon
// of this build writes after it are not copied. It returns how many keys
// it wrote.
func (s *Store) downMarks(ctx context.Context) (int, error) {
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
